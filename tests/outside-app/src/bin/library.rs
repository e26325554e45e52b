// The root README's library snippet, unchanged.
include!(concat!(env!("OUT_DIR"), "/library.rs"));

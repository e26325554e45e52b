// The root README's candle-style snippet, unchanged.
include!(concat!(env!("OUT_DIR"), "/candle_style.rs"));

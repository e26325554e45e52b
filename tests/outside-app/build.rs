//! Extract the root README's snippets marked `<!-- outside-app: NAME -->` (the next ```rust block)
//! into `$OUT_DIR/NAME.rs`, unchanged.

use std::path::Path;

fn main() {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    println!("cargo:rerun-if-changed={}", readme.display());
    let text = std::fs::read_to_string(&readme)
        .unwrap_or_else(|e| panic!("reading {}: {e}", readme.display()));
    let out = std::env::var("OUT_DIR").expect("OUT_DIR");
    for name in ["library", "candle_style"] {
        let marker = format!("<!-- outside-app: {name} -->");
        let at = text
            .find(&marker)
            .unwrap_or_else(|| panic!("README.md has no `{marker}`"));
        let rest = &text[at + marker.len()..];
        let open = rest
            .find("```rust\n")
            .unwrap_or_else(|| panic!("no ```rust block after `{marker}`"))
            + "```rust\n".len();
        let len = rest[open..]
            .find("```")
            .unwrap_or_else(|| panic!("the block after `{marker}` is not closed"));
        std::fs::write(
            Path::new(&out).join(format!("{name}.rs")),
            &rest[open..open + len],
        )
        .expect("writing the snippet");
    }
}

//! Link each guest at its boot address with the architecture's linker script.
fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let script = if target.starts_with("x86_64") {
        "link-x86_64.ld"
    } else if target.starts_with("aarch64") {
        "link-aarch64.ld"
    } else {
        return;
    };
    println!("cargo:rerun-if-changed={script}");
    println!("cargo:rustc-link-arg-bins=-T{dir}/{script}");
}

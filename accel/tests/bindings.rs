//! `src/rustkvm_h.rs` is exactly what bindgen makes of `include/rustkvm.h`
//! (the C view of the ABI): building the accelerator uses the committed
//! bindings and needs no libclang, and this test (which does) catches a
//! header changed without them. `RUSTKVM_BLESS=1` rewrites the file.

use std::path::PathBuf;

/// Give the header's macro constants the C types their users expect:
/// status codes are `int32_t`, everything else `uint32_t`.
#[derive(Debug)]
struct ConstTypes;

impl bindgen::callbacks::ParseCallbacks for ConstTypes {
    fn int_macro(&self, name: &str, _value: i64) -> Option<bindgen::callbacks::IntKind> {
        use bindgen::callbacks::IntKind;
        if name == "RUSTKVM_OK" || name.starts_with("RUSTKVM_E") {
            Some(IntKind::I32)
        } else if name.starts_with("RUSTKVM_") {
            Some(IntKind::U32)
        } else {
            None
        }
    }
}

#[test]
fn the_committed_bindings_are_what_bindgen_makes_of_the_header() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header = root.join("include/rustkvm.h");
    let committed = root.join("src/rustkvm_h.rs");
    let fresh = bindgen::Builder::default()
        .header(header.to_str().expect("utf-8 path"))
        .allowlist_function("rustkvm_.*")
        .allowlist_type("Rustkvm.*")
        .allowlist_var("RUSTKVM_.*")
        .parse_callbacks(Box::new(ConstTypes))
        .use_core()
        .layout_tests(true)
        .generate()
        .expect("bindgen failed on include/rustkvm.h")
        .to_string();
    if std::env::var_os("RUSTKVM_BLESS").is_some() {
        std::fs::write(&committed, &fresh).expect("write src/rustkvm_h.rs");
        return;
    }
    let old = std::fs::read_to_string(&committed).expect("read src/rustkvm_h.rs");
    assert!(
        old == fresh,
        "src/rustkvm_h.rs is out of date with include/rustkvm.h: run \
         RUSTKVM_BLESS=1 cargo test -p rustkvm-accel --test bindings"
    );
}

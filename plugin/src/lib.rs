//! rustkvm's TCG plugin for stock QEMU 10.0.
//!
//! Placeholder: the plugin (instruction, branch and memory counters per vCPU,
//! traces) is its own issue. The crate exists so the workspace layout is final
//! and the cdylib builds and is linted from day one.

/// QEMU plugin API version this plugin will speak (QEMU 10.0 speaks version 4).
pub const PLUGIN_API_VERSION: u32 = 4;

#[cfg(test)]
mod tests {
    #[test]
    fn speaks_qemu_10_0_plugin_api() {
        assert_eq!(super::PLUGIN_API_VERSION, 4);
    }
}

//! x86: KVM's paravirtual interface (CPUID leaves, hypercalls, steal time).

pub mod cpuid;
pub mod hypercall;

//! A KVM hypercall from user mode (CPL 3): KVM answers −KVM_EPERM in RAX
//! (Documentation/virt/kvm/x86/hypercalls.rst) on Intel, where VMCALL is
//! the CPU's own; on AMD, VMCALL raises #UD, which KVM's emulator turns
//! into #GP at CPL 3 (SIGSEGV). Without a hypervisor that implements it,
//! VMCALL raises #UD and the process gets SIGILL. Run in a child process
//! so a signal cannot take the probe down.

use crate::json::Json;

/// Execute VMCALL(KVM_HC_VAPIC_POLL_IRQ) in user mode and report RAX, or the
/// signal that killed the child.
pub fn from_user() -> Json {
    let mut o = Json::obj();
    #[cfg(target_arch = "x86_64")]
    {
        let mut fds = [0i32; 2];
        // SAFETY: pipe fills two descriptors.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            o.set("error", std::io::Error::last_os_error().to_string());
            return o;
        }
        // SAFETY: the probe is single-threaded here; the child only runs
        // async-signal-safe code (the instruction, write, _exit).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let rax: u64;
            // SAFETY: KVM_HC_VAPIC_POLL_IRQ has no side effects; RBX (LLVM's)
            // is saved around it.
            unsafe {
                core::arch::asm!(
                    "mov {save}, rbx", "xor ebx, ebx", "vmcall", "mov rbx, {save}",
                    save = out(reg) _, inout("rax") 1u64 => rax,
                    out("rcx") _, out("rdx") _, out("rsi") _,
                );
                libc::write(fds[1], (&rax as *const u64).cast(), 8);
                libc::_exit(0);
            }
        }
        let mut status = 0;
        let mut rax = 0u64;
        // SAFETY: waiting for our own child; reading 8 bytes into a u64.
        let n = unsafe {
            libc::close(fds[1]);
            libc::waitpid(pid, &mut status, 0);
            let n = libc::read(fds[0], (&mut rax as *mut u64).cast(), 8);
            libc::close(fds[0]);
            n
        };
        if libc::WIFSIGNALED(status) {
            o.set("signal", libc::WTERMSIG(status));
        } else if n == 8 {
            o.set("rax", rax as i64);
        } else {
            o.set("error", "no result from the child");
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    o.set("supported", false);
    o
}

//! A CPU-bound workload for the benchmarks (plugin overhead, PMU
//! overhead): a xorshift generator scattering updates over a 256 KiB table,
//! a linear pass summing it, and an insertion sort of a small array,
//! repeated (loads, stores, taken and not-taken branches, integer ALU
//! work). Returns a checksum so the work cannot be optimised away.

const WORDS: usize = 32 * 1024;
static mut TABLE: [u64; WORDS] = [0; WORDS];

/// Run `rounds` rounds; the checksum.
pub fn run(rounds: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut sum = 0u64;
    // SAFETY: one vCPU runs the workload, the only user of the table.
    let table = unsafe { core::slice::from_raw_parts_mut((&raw mut TABLE).cast::<u64>(), WORDS) };
    for round in 0..rounds {
        for _ in 0..WORDS {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x as usize) % WORDS;
            table[i] = table[i].wrapping_add(x ^ round);
        }
        for v in table.iter() {
            sum = sum.wrapping_add(*v).rotate_left(1);
        }
        let mut small = [0u64; 64];
        for (j, s) in small.iter_mut().enumerate() {
            *s = table[(j * 509 + round as usize) % WORDS];
        }
        for a in 1..small.len() {
            let mut b = a;
            while b > 0 && small[b - 1] > small[b] {
                small.swap(b - 1, b);
                b -= 1;
            }
        }
        sum ^= small[32];
    }
    sum
}

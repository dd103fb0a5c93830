//! `axhost-loopback-cost`: what the kernel charges a server for one small message on loopback.
//!
//! At 64→64 and 100k msg/s the host makes one `recvfrom` and one `sendto` per message
//! (`docs/performance.md`), and those two calls are most of its time. Batching them (io_uring
//! style) saves only the cost of entering and leaving the kernel, not the TCP work inside the
//! call. This tool measures both on the machine at hand:
//!
//! - `syscall_ns`: one trivial system call (`getppid`), the floor any batching can remove;
//! - `send_ns`: one 200-byte `write` on a loopback TCP connection with `TCP_NODELAY`, to a reader
//!   on another CPU, which on loopback includes the receiver's side of TCP, run inside the
//!   sender's call. Twice: with the reader spinning on a non-blocking socket (it never sleeps, so
//!   no write has to wake it), and with the reader blocked in `read` (a write may wake it).
//!
//! The writer runs on `--writer-cpu`, the reader on `--reader-cpu`; `--gap-us` spaces the writes
//! (the writer spins between them), so the reader drains each one before the next, as at a fixed
//! rate. Prints one JSON line.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;

/// The payload size `axhost-load` sends.
const MESSAGE_BYTES: usize = 200;

#[derive(Parser, Debug)]
#[command(
    name = "axhost-loopback-cost",
    about = "The cost of one system call, and of one 200-byte loopback TCP write, on this machine"
)]
struct Options {
    /// Writes per reader mode.
    #[arg(long, default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    writes: u64,
    /// Spacing between writes, in microseconds (0: back to back).
    #[arg(long = "gap-us", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    gap_us: u64,
    /// The CPU the writer (the "server") runs on.
    #[arg(long = "writer-cpu", default_value_t = 0)]
    writer_cpu: usize,
    /// The CPU the reader (the "client") runs on.
    #[arg(long = "reader-cpu", default_value_t = 1)]
    reader_cpu: usize,
}

/// Pins the calling thread to `cpu`; a no-op where that is not supported.
fn pin(cpu: usize) {
    #[cfg(target_os = "linux")]
    // SAFETY: `set` is a plain bit set owned by this frame; the call only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!(
                "could not pin to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpu;
}

/// Nanoseconds per trivial system call, over `n` calls.
fn syscall_ns(n: u64) -> f64 {
    let started = Instant::now();
    for _ in 0..n {
        #[cfg(target_os = "linux")]
        // SAFETY: `getppid` takes no arguments and cannot fail.
        unsafe {
            libc::syscall(libc::SYS_getppid);
        }
        #[cfg(not(target_os = "linux"))]
        std::hint::black_box(std::process::id());
    }
    started.elapsed().as_nanos() as f64 / n as f64
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reader {
    Spinning,
    Sleeping,
}

/// Per-write times of `o.writes` writes to a reader of `kind`: mean, median and p99, in ns.
fn send_ns(o: &Options, kind: Reader) -> std::io::Result<(f64, u64, u64)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let reader_cpu = o.reader_cpu;
    let reader = thread::spawn(move || -> std::io::Result<u64> {
        pin(reader_cpu);
        let mut stream = TcpStream::connect(address)?;
        stream.set_nonblocking(kind == Reader::Spinning)?;
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0u64;
        loop {
            match stream.read(&mut buf) {
                Ok(0) => return Ok(total),
                Ok(n) => total += n as u64,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    });
    pin(o.writer_cpu);
    let (mut stream, _) = listener.accept()?;
    stream.set_nodelay(true)?;
    let message = [b'x'; MESSAGE_BYTES];
    let gap = Duration::from_micros(o.gap_us);
    let mut times = Vec::with_capacity(usize::try_from(o.writes).unwrap_or(0));
    for _ in 0..o.writes {
        let due = Instant::now() + gap;
        while Instant::now() < due {
            std::hint::spin_loop();
        }
        let started = Instant::now();
        stream.write_all(&message)?;
        times.push(started.elapsed().as_nanos() as u64);
    }
    drop(stream);
    let received = reader
        .join()
        .map_err(|_| std::io::Error::other("the reader panicked"))??;
    if received != o.writes * MESSAGE_BYTES as u64 {
        return Err(std::io::Error::other(format!(
            "the reader got {received} bytes, expected {}",
            o.writes * MESSAGE_BYTES as u64
        )));
    }
    let mean = times.iter().sum::<u64>() as f64 / times.len().max(1) as f64;
    times.sort_unstable();
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    Ok((mean, at(0.5), at(0.99)))
}

fn main() {
    let o = Options::parse();
    pin(o.writer_cpu);
    let syscall = syscall_ns(2_000_000);
    let mut modes = Vec::new();
    for kind in [Reader::Spinning, Reader::Sleeping] {
        match send_ns(&o, kind) {
            Ok((mean, p50, p99)) => modes.push(format!(
                "\"{}\":{{\"mean\":{mean:.0},\"p50\":{p50},\"p99\":{p99}}}",
                if kind == Reader::Spinning {
                    "reader_spinning"
                } else {
                    "reader_sleeping"
                }
            )),
            Err(e) => {
                eprintln!("axhost-loopback-cost: {e}");
                std::process::exit(1);
            }
        }
    }
    println!(
        "{{\"syscall_ns\":{syscall:.0},\"message_bytes\":{MESSAGE_BYTES},\"writes\":{},\"gap_us\":{},\"send_ns\":{{{}}}}}",
        o.writes,
        o.gap_us,
        modes.join(",")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_run_delivers_every_byte_in_both_modes() {
        let o =
            Options::try_parse_from(["cost", "--writes", "200", "--gap-us", "0"]).expect("options");
        for kind in [Reader::Spinning, Reader::Sleeping] {
            let (mean, p50, p99) = send_ns(&o, kind).expect("run");
            assert!(mean > 0.0 && p50 <= p99, "{kind:?}: {mean} {p50} {p99}");
        }
        assert!(syscall_ns(1000) > 0.0);
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(Options::try_parse_from(["cost", "--writes", "0"]).is_err());
        assert!(Options::try_parse_from(["cost", "--gap-us", "-1"]).is_err());
    }
}

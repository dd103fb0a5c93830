//! The kernel's receive timestamp (Linux `SO_TIMESTAMPNS`): when the bytes a read returns reached
//! the receiving socket, as opposed to when the tool got round to reading them.
//!
//! Why: on one CPU the load tool reads 64 sockets between its writes, so a message can sit in a
//! socket while the tool is busy elsewhere, and that wait counts as the server's latency. The
//! timestamp is taken where the server's write hands the segment to loopback (on the server's
//! CPU), so "sender stamp → socket" covers the server and the kernel path and nothing of the
//! tool's reading.
//!
//! TCP reports the timestamp of the *last* segment a read consumed (segments the kernel
//! coalesced keep the later stamp), so every message completed by a read gets a time at or after
//! its own arrival: the figure can only overstate the latency, never understate it.
//!
//! The first socket that asks turns stamping on for the whole system through a deferred kernel
//! work item, so segments in the first moments after `enable` may come unstamped; the tool's
//! warmup covers that, and the report counts messages in the window that had no stamp.
//!
//! The kernel stamps with `CLOCK_REALTIME`; the tool's clock is monotonic. A read converts by age:
//! `arrival = now_monotonic - (now_realtime - stamp)`, both clocks read right after the read,
//! so only a clock step in those nanoseconds could skew it.

use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use mio::net::TcpStream;

/// Asks the kernel to stamp what `stream` receives. Elsewhere than Linux: `Ok(false)`.
pub fn enable(stream: &TcpStream) -> io::Result<bool> {
    imp::enable(stream)
}

/// Reads into `buf` like `Read::read`; also returns how many nanoseconds before the call
/// returned the last byte read reached the socket, when the kernel says.
pub fn read(stream: &TcpStream, buf: &mut [u8]) -> io::Result<(usize, Option<u64>)> {
    let (n, stamp) = imp::read(stream, buf)?;
    let age = stamp.map(|at| realtime_ns().saturating_sub(at));
    Ok((n, age))
}

fn realtime_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(target_os = "linux")]
mod imp {
    use std::io;
    use std::mem::{size_of, size_of_val, zeroed};
    use std::os::fd::AsRawFd;

    use mio::net::TcpStream;

    pub fn enable(stream: &TcpStream) -> io::Result<bool> {
        let on: libc::c_int = 1;
        // SAFETY: a valid socket descriptor (borrowed for the call), a pointer to an int that
        // outlives it, and that int's size.
        let rc = unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_TIMESTAMPNS,
                (&on as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(true)
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// `recvmsg` with room for one timestamp; the stamp in ns since the Unix epoch.
    pub fn read(stream: &TcpStream, buf: &mut [u8]) -> io::Result<(usize, Option<u64>)> {
        // u64 words keep the control buffer aligned for `cmsghdr`; 64 bytes hold the header
        // and a `timespec` with room to spare.
        let mut control = [0u64; 8];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: `msghdr` is plain data; all-zero is a valid empty header.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = size_of_val(&control) as _;
        // SAFETY: `msg` points at one iovec over `buf` and at `control`, all of which outlive
        // the call; the kernel writes at most their stated lengths.
        let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut stamp = None;
        // SAFETY: the CMSG_* walk stays within `msg_controllen`, which the kernel set to what
        // it wrote into `control`; the payload is read unaligned as the timespec it is.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                let h = &*cmsg;
                if h.cmsg_level == libc::SOL_SOCKET
                    && h.cmsg_type == libc::SCM_TIMESTAMPNS
                    && h.cmsg_len as usize
                        >= libc::CMSG_LEN(size_of::<libc::timespec>() as u32) as usize
                {
                    let ts: libc::timespec =
                        std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::timespec>());
                    if ts.tv_sec > 0 {
                        stamp = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        Ok((n as usize, stamp))
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::io::{self, Read};

    use mio::net::TcpStream;

    pub fn enable(_: &TcpStream) -> io::Result<bool> {
        Ok(false)
    }

    pub fn read(mut stream: &TcpStream, buf: &mut [u8]) -> io::Result<(usize, Option<u64>)> {
        Ok((stream.read(buf)?, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::{Duration, Instant};

    /// A stamped read over loopback: the stamp is there (once the kernel has turned stamping
    /// on), and the bytes sat in the socket about as long as the test waited before reading them.
    #[test]
    fn a_read_says_how_long_its_bytes_waited() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut tx =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (rx, _) = listener.accept().expect("accept");
        let rx = TcpStream::from_std(rx);
        if !enable(&rx).expect("SO_TIMESTAMPNS") {
            return; // not Linux: nothing to check
        }
        let mut buf = [0u8; 64];
        // Stamping starts from a deferred kernel work item: wait for the first stamped read.
        let mut primed = false;
        for _ in 0..200 {
            tx.write_all(b"x").expect("write");
            std::thread::sleep(Duration::from_millis(5));
            let (n, age) = read(&rx, &mut buf).expect("read");
            assert_eq!(&buf[..n], b"x");
            if age.is_some() {
                primed = true;
                break;
            }
        }
        assert!(primed, "no read was stamped within a second");
        tx.write_all(b"hello").expect("write");
        let wrote = Instant::now();
        std::thread::sleep(Duration::from_millis(30));
        let (n, age) = read(&rx, &mut buf).expect("read");
        let waited = wrote.elapsed().as_nanos() as u64;
        assert_eq!(&buf[..n], b"hello");
        let age = age.expect("a kernel timestamp");
        assert!(
            (25_000_000..=waited + 1_000_000).contains(&age),
            "age {age} ns, waited {waited} ns"
        );
    }
}

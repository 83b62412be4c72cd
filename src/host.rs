//! This node's network address, for the `(ip, pid, device)` locations of partitions that SPMD
//! programs write (`MpiComm` in Rust, `dlpart.mpi` and `Location.here` in Python, which reads
//! it through `_core`).

#[cfg(unix)]
use std::ffi::{c_char, c_int, CStr};
use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};

/// This node's address as other nodes reach it, which the locations `dlpart.mpi` and
/// `MpiComm` write name: the first IPv4 address of the host name or of a network interface
/// that is not loopback, else `127.0.0.1`.
pub(crate) fn this_host() -> String {
    let named = host_name()
        .and_then(|name| (name.as_str(), 0).to_socket_addrs().ok())
        .into_iter()
        .flatten()
        .filter_map(|a| match a.ip() {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        });
    named
        .chain(interface_addresses())
        .find(|ip| !ip.is_loopback())
        .unwrap_or(Ipv4Addr::LOCALHOST)
        .to_string()
}

#[cfg(unix)]
fn host_name() -> Option<String> {
    let mut buf = [0 as c_char; 256];
    // SAFETY: `buf` holds `buf.len()` bytes for gethostname to write; its last byte stays NUL
    // (only `len - 1` are offered), so the name read below is terminated.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr(), buf.len() - 1) };
    if rc != 0 {
        return None;
    }
    // SAFETY: NUL-terminated within `buf` (see above).
    let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned()).filter(|n| !n.is_empty())
}

/// The IPv4 address of every network interface (`getifaddrs`), in the system's order.
#[cfg(unix)]
fn interface_addresses() -> Vec<Ipv4Addr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid pointer to write the list's head to.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut at = head;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list getifaddrs made, alive until freeifaddrs below.
        let ifa = unsafe { &*at };
        let addr = ifa.ifa_addr;
        // SAFETY: a non-null `ifa_addr` points to a socket address whose `sa_family` says its
        // type; an AF_INET one is a `sockaddr_in`.
        unsafe {
            if !addr.is_null() && c_int::from((*addr).sa_family) == libc::AF_INET {
                let sin = &*addr.cast::<libc::sockaddr_in>();
                out.push(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
        }
        at = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once; nothing of it is used after.
    unsafe { libc::freeifaddrs(head) };
    out
}

#[cfg(not(unix))]
fn host_name() -> Option<String> {
    None
}

#[cfg(not(unix))]
fn interface_addresses() -> Vec<Ipv4Addr> {
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "calls getifaddrs and the resolver")]
    fn the_address_is_an_interface_s_or_the_host_name_s_and_loopback_only_without_others() {
        let ip: Ipv4Addr = this_host().parse().expect("an IPv4 address");
        let interfaces = interface_addresses();
        let named: Vec<Ipv4Addr> = host_name()
            .and_then(|n| (n.as_str(), 0).to_socket_addrs().ok())
            .into_iter()
            .flatten()
            .filter_map(|a| match a.ip() {
                IpAddr::V4(ip) => Some(ip),
                IpAddr::V6(_) => None,
            })
            .collect();
        let others = named.iter().chain(&interfaces).any(|ip| !ip.is_loopback());
        assert_eq!(
            ip.is_loopback(),
            !others,
            "{ip} among {named:?} and {interfaces:?}"
        );
        if !ip.is_loopback() {
            assert!(named.contains(&ip) || interfaces.contains(&ip), "{ip}");
        }
    }
}

//! This node's network address, for the `(ip, pid, device)` locations of partitions that SPMD
//! programs write (`MpiComm` in Rust, `dlpart.mpi` and `Location.here` in Python, which reads
//! it through `_core`).

#[cfg(unix)]
use std::ffi::{c_char, c_int, CStr};
use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};

/// This node's address as other nodes reach it, which the locations `dlpart.mpi` and
/// `MpiComm` write name: the first IPv4 address of the host name or of a network interface
/// that is not loopback, else `127.0.0.1` (see [`pick`]).
pub(crate) fn this_host() -> String {
    let named = host_name()
        .and_then(|name| (name.as_str(), 0).to_socket_addrs().ok())
        .into_iter()
        .flatten()
        .map(|a| a.ip());
    pick(named, interface_addresses()).to_string()
}

/// The address [`this_host`] names, from the host name's addresses `named` (resolved, in
/// the resolver's order) and the IPv4 addresses of the network `interfaces`: the first IPv4
/// address that is not loopback, the host name's before the interfaces', else `127.0.0.1`.
fn pick(named: impl IntoIterator<Item = IpAddr>, interfaces: Vec<Ipv4Addr>) -> Ipv4Addr {
    named
        .into_iter()
        .filter_map(|ip| match ip {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        })
        .chain(interfaces)
        .find(|ip| !ip.is_loopback())
        .unwrap_or(Ipv4Addr::LOCALHOST)
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

    const V6: IpAddr = IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1));

    fn v4(a: u8, b: u8, c: u8, d: u8) -> Ipv4Addr {
        Ipv4Addr::new(a, b, c, d)
    }

    #[test]
    fn the_host_name_s_first_ipv4_address_that_is_not_loopback_comes_first() {
        let named = [V6, v4(127, 0, 1, 1).into(), v4(10, 0, 0, 7).into()];
        let got = pick(named, vec![v4(192, 168, 1, 2)]);
        assert_eq!(got, v4(10, 0, 0, 7));
    }

    #[test]
    fn without_one_the_first_interface_that_is_not_loopback_is_named() {
        // The host name resolving to IPv6 and loopback only (as /etc/hosts often has it).
        let named = [
            V6,
            v4(127, 0, 1, 1).into(),
            IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        ];
        let interfaces = vec![v4(127, 0, 0, 1), v4(172, 17, 0, 3), v4(10, 1, 2, 3)];
        assert_eq!(pick(named, interfaces.clone()), v4(172, 17, 0, 3));
        // No host name, or one that does not resolve.
        assert_eq!(pick([], interfaces), v4(172, 17, 0, 3));
    }

    #[test]
    fn loopback_only_or_nothing_names_127_0_0_1() {
        let named = [v4(127, 0, 1, 1).into(), V6];
        assert_eq!(pick(named, vec![v4(127, 0, 0, 1)]), v4(127, 0, 0, 1));
        assert_eq!(pick([], vec![v4(127, 5, 5, 5)]), v4(127, 0, 0, 1));
        assert_eq!(pick([V6], Vec::new()), v4(127, 0, 0, 1));
    }

    #[test]
    #[cfg_attr(miri, ignore = "calls getifaddrs and the resolver")]
    fn this_host_names_an_ipv4_address() {
        let host = this_host();
        let ip: Ipv4Addr = host.parse().expect("an IPv4 address");
        // Loopback only as the fallback itself.
        assert!(!ip.is_loopback() || ip == Ipv4Addr::LOCALHOST, "{host}");
    }
}

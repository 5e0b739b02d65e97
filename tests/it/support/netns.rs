//! A host across a real network, for partition tests: receivers bind inside a network
//! namespace ("far") that this machine reaches only through a second one acting as a router
//! ("hop"), over two veth pairs:
//!
//! ```text
//!   this machine ── veth ── hop (forwards) ── veth ── far (the receivers)
//!   10.231.N.1/30          .2/30 │ .5/30              .6/30
//! ```
//!
//! `cut` adds blackhole routes on the router for both ends, so every packet in either
//! direction is dropped without an answer: new connections time out and open ones hang, as
//! in a real partition (a route removed on this machine would fail fast instead). `heal`
//! removes them. Needs root and iproute2, as CI has.
#![allow(dead_code)]

use std::net::TcpListener;
use std::os::fd::AsFd;
use std::process::Command;

use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

pub struct FarHost {
    hop: String,
    far: String,
    link: String,
    net: u8,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("iproute2 (ip)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn in_ns(ns: &str, args: &[&str]) {
    let mut all = vec!["netns", "exec", ns, "ip"];
    all.extend_from_slice(args);
    ip(&all);
}

impl FarHost {
    pub fn new() -> Self {
        let tag: u16 = rand::random();
        let net: u8 = rand::random();
        let h = Self {
            hop: format!("rhhop{tag}"),
            far: format!("rhfar{tag}"),
            link: format!("rhl{tag}"),
            net,
        };
        let (host_if, hop_in, hop_out, far_if) = (
            h.link.clone(),
            format!("{}h", h.link),
            format!("{}o", h.link),
            format!("{}f", h.link),
        );
        let a = |last: u8| format!("10.231.{net}.{last}");
        ip(&["netns", "add", &h.hop]);
        ip(&["netns", "add", &h.far]);
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &hop_in, "netns", &h.hop,
        ]);
        ip(&[
            "link", "add", &hop_out, "netns", &h.hop, "type", "veth", "peer", "name", &far_if,
            "netns", &h.far,
        ]);
        ip(&["addr", "add", &format!("{}/30", a(1)), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        in_ns(
            &h.hop,
            &["addr", "add", &format!("{}/30", a(2)), "dev", &hop_in],
        );
        in_ns(
            &h.hop,
            &["addr", "add", &format!("{}/30", a(5)), "dev", &hop_out],
        );
        for dev in [hop_in.as_str(), hop_out.as_str(), "lo"] {
            in_ns(&h.hop, &["link", "set", dev, "up"]);
        }
        let forward = Command::new("ip")
            .args([
                "netns",
                "exec",
                &h.hop,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ])
            .status()
            .is_ok_and(|s| s.success());
        assert!(forward, "forwarding on the router namespace");
        in_ns(
            &h.far,
            &["addr", "add", &format!("{}/30", a(6)), "dev", &far_if],
        );
        in_ns(&h.far, &["link", "set", &far_if, "up"]);
        in_ns(&h.far, &["link", "set", "lo", "up"]);
        in_ns(&h.far, &["route", "add", "default", "via", &a(5)]);
        ip(&["route", "add", &format!("10.231.{net}.4/30"), "via", &a(2)]);
        h
    }

    /// The far host's address.
    pub fn addr(&self) -> String {
        format!("10.231.{}.6", self.net)
    }

    /// A listener on the far host (any free port). The socket belongs to the far namespace
    /// for good; the thread that enters the namespace to create it ends right after.
    pub fn bind(&self) -> TcpListener {
        let path = format!("/var/run/netns/{}", self.far);
        let addr = format!("{}:0", self.addr());
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("namespace handle");
            move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network))
                .expect("setns into the far host");
            let l = TcpListener::bind(&addr).expect("bind on the far host");
            l.set_nonblocking(true).expect("nonblocking");
            l
        })
        .join()
        .expect("bind thread")
    }

    /// Every packet between this machine and the far host is dropped from now on.
    pub fn cut(&self) {
        for last in [6, 1] {
            in_ns(
                &self.hop,
                &[
                    "route",
                    "add",
                    "blackhole",
                    &format!("10.231.{}.{last}/32", self.net),
                ],
            );
        }
    }

    pub fn heal(&self) {
        for last in [6, 1] {
            in_ns(
                &self.hop,
                &[
                    "route",
                    "del",
                    "blackhole",
                    &format!("10.231.{}.{last}/32", self.net),
                ],
            );
        }
    }
}

impl Drop for FarHost {
    fn drop(&mut self) {
        // Deleting the namespaces deletes the veth pairs and, with them, the route.
        for ns in [&self.hop, &self.far] {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(std::process::Stdio::null())
                .status();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .status();
    }
}

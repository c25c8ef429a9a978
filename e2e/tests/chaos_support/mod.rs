//! Three machines on one for the chaos cases: the engine alone on a storage namespace, and two
//! client nodes, each a namespace of its own with its mount keeper, node plugin and workers,
//! linked to the storage namespace by a veth pair that the test cuts and restores.

pub mod delay;
pub mod load;

use dpufs_e2e::EngineNetwork;
use dpufs_e2e::csi_bed::{BedOptions, CsiPlugins, tempdir, two_tenants, write_agent_key};
use dpufs_e2e::netns::{End, Netns, veth};
use dpufs_e2e::volume::EngineVolume;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The namespaces, and the storage side of each node's link.
#[derive(Debug)]
pub struct Topology {
    pub storage: Netns,
    pub nodes: Vec<Netns>,
    /// The engine's address, on the storage namespace's link to the test's namespace (the
    /// test provisions through it); the nodes route to it through their own links.
    pub engine_ip: Ipv4Addr,
    /// The storage namespace's end of each node's link: taking it down cuts the node off.
    node_links: Vec<String>,
}

impl Topology {
    /// A storage namespace linked to the test's namespace and to `nodes` node namespaces;
    /// subnets and names of their own per process.
    pub fn create(nodes: usize) -> Topology {
        // Names carry the whole pid, which no other live run has (interface names stay within
        // the kernel's 15 characters); what a killed run left behind goes first.
        let tag = std::process::id();
        remove_leftovers();
        let third = free_subnet(tag);
        let net = |second: u8, last: u8| Ipv4Addr::new(10, second, third, last);
        let cidr = |ip: Ipv4Addr| format!("{ip}/24");
        let storage = Netns::create(&format!("dpufs-chaos-st{tag}")).expect("storage namespace");
        let engine_ip = net(223, 1);
        veth(
            End {
                ifname: &format!("cst{tag}"),
                netns: Some(&storage),
                cidr: &cidr(engine_ip),
            },
            End {
                ifname: &format!("ctt{tag}"),
                netns: None,
                cidr: &cidr(net(223, 2)),
            },
        )
        .expect("the test's link to the storage network");
        let mut topology = Topology {
            storage,
            nodes: Vec::new(),
            engine_ip,
            node_links: Vec::new(),
        };
        for i in 0..nodes {
            let second = 224 + u8::try_from(i).expect("a few nodes");
            let node = Netns::create(&format!("dpufs-chaos-n{i}-{tag}")).expect("node namespace");
            let link = format!("cs{i}-{tag}");
            veth(
                End {
                    ifname: &link,
                    netns: Some(&topology.storage),
                    cidr: &cidr(net(second, 1)),
                },
                End {
                    ifname: &format!("cn{i}-{tag}"),
                    netns: Some(&node),
                    cidr: &cidr(net(second, 2)),
                },
            )
            .expect("a node's link");
            let engine_net = format!("{}/24", net(223, 0));
            let via = net(second, 1).to_string();
            node.ip(&["route", "add", &engine_net, "via", &via])
                .expect("the node's route to the engine");
            topology.nodes.push(node);
            topology.node_links.push(link);
        }
        topology
    }

    /// Cuts node `i` off the storage network: its link goes down at the storage end, so
    /// whatever either side sends is lost, as when a switch port dies.
    pub fn cut(&self, i: usize) {
        self.storage
            .ip(&["link", "set", &self.node_links[i], "down"])
            .expect("cut the link");
    }

    /// Restores node `i`'s link.
    pub fn restore(&self, i: usize) {
        self.storage
            .ip(&["link", "set", &self.node_links[i], "up"])
            .expect("restore the link");
    }

    /// Makes node `i` drop `percent` % of the packets it sends and of those it receives, at
    /// random (iptables' `statistic` match: this kernel has no `netem`).
    pub fn lose(&self, i: usize, percent: u32) {
        let p = format!("{:.2}", f64::from(percent) / 100.0);
        for chain in ["INPUT", "OUTPUT"] {
            let rule = ["-A", chain, "-m", "statistic", "--mode", "random"];
            let target = ["--probability", &p, "-j", "DROP"];
            self.run_iptables(i, &[&rule[..], &target[..]].concat());
        }
    }

    /// Delays every packet node `i` sends or receives (but on its loopback) by `delay`, in
    /// order: a [`delay::DelayLine`] behind iptables' NFQUEUE (this kernel has no `netem`).
    pub fn delay(&self, i: usize, delay: Duration) -> delay::DelayLine {
        let queue = 100 + u16::try_from(i).expect("a few nodes");
        let line = delay::DelayLine::start(&self.nodes[i], queue, delay);
        let queue = queue.to_string();
        for (chain, side) in [("INPUT", "-i"), ("OUTPUT", "-o")] {
            let rule = ["-A", chain, "!", side, "lo"];
            let target = ["-j", "NFQUEUE", "--queue-num", &queue, "--queue-bypass"];
            self.run_iptables(i, &[&rule[..], &target[..]].concat());
        }
        line
    }

    /// Node `i`'s packets go straight again; the packets `line` delayed.
    pub fn stop_delaying(&self, i: usize, line: delay::DelayLine) -> u64 {
        self.run_iptables(i, &["-F"]);
        line.stop()
    }

    /// Node `i` loses nothing any more; the packets its rules dropped.
    pub fn stop_losing(&self, i: usize) -> u64 {
        let out = self
            .iptables(i, &["-L", "-v", "-x", "-n"])
            .output()
            .expect("run iptables");
        // Rule lines start with their packet count; the DROP rules are the only rules.
        let dropped = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("DROP") && !l.starts_with("Chain"))
            .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            .sum();
        self.run_iptables(i, &["-F"]);
        dropped
    }

    /// Runs iptables in node `i`'s namespace; it must succeed.
    fn run_iptables(&self, i: usize, args: &[&str]) {
        let status = self.iptables(i, args).status().expect("run iptables");
        assert!(status.success(), "iptables {args:?} in node {i}: {status}");
    }

    fn iptables(&self, i: usize, args: &[&str]) -> Command {
        let mut cmd = Command::new("iptables");
        cmd.args(args);
        self.nodes[i]
            .enter_on_exec(&mut cmd)
            .expect("enter the node's namespace");
        cmd
    }
}

/// The engine on the storage network and a keeper and node plugin on each node, all with the
/// static directory of one system (the pool `fast`, tenants `team-a` and `team-b`).
pub struct Cluster {
    /// Declared first, so dropped first: the nodes' processes and mounts go before the engine,
    /// and the namespaces after everything in them.
    pub nodes: Vec<CsiPlugins>,
    _fabric_dirs: Vec<tempfile::TempDir>,
    pub vol: EngineVolume,
    pub net: Topology,
}

impl Cluster {
    /// `nodes` nodes and an engine whose pool holds `pool_bytes`.
    pub async fn start(binary: PathBuf, nodes: usize, pool_bytes: u64) -> Cluster {
        let net = Topology::create(nodes);
        let network = EngineNetwork {
            netns: net.storage.path(),
            ip: net.engine_ip.into(),
        };
        let vol = tokio::task::spawn_blocking(move || {
            EngineVolume::start_on(1, pool_bytes, Some(network))
        })
        .await
        .expect("engine volume");
        let system = serde_json::json!({
            "endpoints": [vol.engine.addr],
            "dataEndpoint": vol.fabric_addr(),
        });
        let mut plugins = Vec::new();
        let mut fabric_dirs = Vec::new();
        for (i, ns) in net.nodes.iter().enumerate() {
            let dir = tempdir(&format!("dpufs-chaos-node{i}-"));
            let key = write_agent_key(dir.path(), &vol.agent);
            // Each node has its own software device, as each machine has its own NIC.
            let fabric = tempfile::Builder::new()
                .prefix("dpufs-chaos-fabric")
                .tempdir_in("/dev/shm")
                .expect("the node's fabric directory");
            let mut opts = BedOptions::new(binary.clone());
            opts.node_id = format!("node-{i}");
            opts.netns = Some(ns.path());
            opts.log_to_files = true;
            let node_args = vec![
                "--agent-key".into(),
                key,
                "--fabric-dir".into(),
                fabric.path().to_path_buf(),
            ];
            fabric_dirs.push(fabric);
            let node = CsiPlugins::start(
                opts,
                dir,
                system.clone(),
                &vol.pool,
                two_tenants(),
                node_args,
                Vec::new(),
            )
            .await;
            plugins.push(node);
        }
        Cluster {
            nodes: plugins,
            _fabric_dirs: fabric_dirs,
            vol,
            net,
        }
    }
}

/// The namespaces of chaos runs whose process is gone (killed before their drop ran). Their
/// links go with them: a veth pair dies with either end's namespace.
fn remove_leftovers() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for name in entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
    {
        let Some(rest) = name.strip_prefix("dpufs-chaos-") else {
            continue;
        };
        let pid = rest
            .rsplit(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap_or("");
        if !pid.is_empty() && !std::path::Path::new("/proc").join(pid).exists() {
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
    }
}

/// The third octet of a 10.223.x.0/24 subnet no address of the test's namespace is in yet
/// (another run's link to its storage namespace), starting from one derived from `tag`.
fn free_subnet(tag: u32) -> u8 {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .expect("run ip addr");
    let listing = String::from_utf8_lossy(&out.stdout);
    let used = |third: u32| listing.contains(&format!(" 10.223.{third}."));
    let third = (0..240)
        .map(|k| (tag + k) % 240)
        .find(|&third| !used(third))
        .expect("a free 10.223.x.0/24 subnet");
    u8::try_from(third).expect("below 240")
}

//! What the document records about the build, the machine and the server.
//!
//! The SDK build, the compiler, the server and its durability are recorded
//! by the fault suite's report too: those functions live in
//! [`pgmq_testkit::environment`] and are re-exported here. The machine
//! (host, virtualization, load, CPU governor) and the runtime are the
//! benchmark's own.

pub use pgmq_testkit::environment::{
    build, classify, database, durability, is_recorded, sdk, select1_round_trip, storage,
    DURABILITY_SETTINGS, RECORDED_SETTINGS, ROUND_TRIP_SAMPLES, ROUND_TRIP_WARMUP,
};

use crate::document::{Host, RuntimeInfo, Virtualization};

/// The runtime the caller runs on: its worker threads, read from the
/// runtime itself (not from the command line that configured it).
pub fn runtime() -> Option<RuntimeInfo> {
    let handle = tokio::runtime::Handle::try_current().ok()?;
    Some(RuntimeInfo {
        tokio_worker_threads: u32::try_from(handle.metrics().num_workers()).unwrap_or(u32::MAX),
    })
}

async fn read(path: &str) -> Option<String> {
    tokio::fs::read_to_string(path).await.ok()
}

/// The 1-minute load average.
pub async fn load_average() -> Option<f64> {
    read("/proc/loadavg")
        .await?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn os_release_pretty(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix("PRETTY_NAME=")?;
        Some(v.trim_matches('"').to_owned())
    })
}

fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "model name").then(|| v.trim().to_owned())
    })
}

fn mem_total(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let v = l.strip_prefix("MemTotal:")?;
        let kb: u64 = v.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    })
}

/// The machine: OS, kernel, CPU, memory, cgroup limits, load.
pub async fn host() -> Host {
    let cgroup_dir = read("/proc/self/cgroup").await.and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("0::").map(|p| p.trim().to_owned()))
    });
    let (cpu_max, mem_max) = match &cgroup_dir {
        Some(dir) => (
            read(&format!("/sys/fs/cgroup{dir}/cpu.max")).await,
            read(&format!("/sys/fs/cgroup{dir}/memory.max")).await,
        ),
        None => (None, None),
    };
    Host {
        os: std::env::consts::OS.to_owned(),
        os_release: read("/etc/os-release")
            .await
            .as_deref()
            .and_then(os_release_pretty),
        kernel: read("/proc/sys/kernel/osrelease")
            .await
            .map(|s| s.trim().to_owned()),
        arch: std::env::consts::ARCH.to_owned(),
        cpu_model: read("/proc/cpuinfo").await.as_deref().and_then(cpu_model),
        cpu_count: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        memory_bytes: read("/proc/meminfo").await.as_deref().and_then(mem_total),
        cgroup_cpu_max: cpu_max.map(|s| s.trim().to_owned()),
        cgroup_memory_max: mem_max.map(|s| s.trim().to_owned()),
        load_average_start: load_average().await,
        load_average_end: None,
        virtualization: Some(virtualization().await),
        cpu_governor: cpu_governor().await,
    }
}

/// Whether the `flags` line of /proc/cpuinfo names `hypervisor`; None when
/// the file has no `flags` line (other architectures name them differently).
fn hypervisor_flag(cpuinfo: &str) -> Option<bool> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "flags").then(|| v.split_whitespace().any(|f| f == "hypervisor"))
    })
}

/// `systemd-detect-virt <flag>`'s answer (it prints `none` and exits 1 when
/// there is none); None when the tool is missing or says nothing.
async fn detect_virt(flag: &str) -> Option<String> {
    let run = tokio::process::Command::new("systemd-detect-virt")
        .arg(flag)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(5), run)
        .await
        .ok()?
        .ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn trimmed(s: Option<String>) -> Option<String> {
    s.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

/// What this host says about running in a virtual machine or a container.
pub async fn virtualization() -> Virtualization {
    Virtualization {
        vm: detect_virt("--vm").await,
        container: detect_virt("--container").await,
        hypervisor_cpu_flag: read("/proc/cpuinfo")
            .await
            .as_deref()
            .and_then(hypervisor_flag),
        sys_vendor: trimmed(read("/sys/class/dmi/id/sys_vendor").await),
        product_name: trimmed(read("/sys/class/dmi/id/product_name").await),
    }
}

/// The distinct values among `governors`, sorted and joined by `,`; None
/// when there are none.
fn distinct_joined(governors: impl IntoIterator<Item = String>) -> Option<String> {
    let set: std::collections::BTreeSet<String> = governors
        .into_iter()
        .map(|g| g.trim().to_owned())
        .filter(|g| !g.is_empty())
        .collect();
    (!set.is_empty()).then(|| set.into_iter().collect::<Vec<_>>().join(","))
}

/// The `scaling_governor` of every CPU that exposes one.
pub async fn cpu_governor() -> Option<String> {
    let mut dir = tokio::fs::read_dir("/sys/devices/system/cpu").await.ok()?;
    let mut found = Vec::new();
    while let Ok(Some(e)) = dir.next_entry().await {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let is_cpu = name
            .strip_prefix("cpu")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if is_cpu {
            if let Some(g) = read(&format!(
                "/sys/devices/system/cpu/{name}/cpufreq/scaling_governor"
            ))
            .await
            {
                found.push(g);
            }
        }
    }
    distinct_joined(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_files() {
        assert_eq!(
            os_release_pretty("NAME=x\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n")
                .as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(
            cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n").as_deref(),
            Some("AMD EPYC 7B13")
        );
        assert_eq!(mem_total("MemTotal:       1024 kB\n"), Some(1024 * 1024));
    }

    #[test]
    fn reads_virtualization_and_governors() {
        assert_eq!(
            hypervisor_flag("processor\t: 0\nflags\t\t: fpu vme hypervisor lahf_lm\n"),
            Some(true)
        );
        assert_eq!(hypervisor_flag("flags\t\t: fpu vme\n"), Some(false));
        assert_eq!(hypervisor_flag("Features\t: fp asimd\n"), None);
        let g = |v: &[&str]| distinct_joined(v.iter().map(|s| format!("{s}\n")));
        assert_eq!(
            g(&["performance", "performance"]).as_deref(),
            Some("performance")
        );
        assert_eq!(
            g(&["powersave", "performance"]).as_deref(),
            Some("performance,powersave")
        );
        assert_eq!(g(&[]), None);
    }

    #[tokio::test]
    async fn runtime_reports_its_workers() {
        // The test runtime is current-thread: one worker.
        assert_eq!(runtime().unwrap().tokio_worker_threads, 1);
    }
}

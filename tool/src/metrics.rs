//! `--metrics`: one container's region in the Prometheus text format, with the names, help texts,
//! types and labels of HAMi's vGPUmonitor (HAMi 4707fb02, cmd/vGPUmonitor/metrics.go,
//! `collectContainerMetrics`), so that a sidecar can expose one container without the monitor.
//!
//! The monitor learns namespace, pod and container from Kubernetes; this tool has only the file.
//! The container comes from the region's directory where it is named as the monitor's
//! (`<pod-uid>_<container>`, as on the node under `/usr/local/vgpu/containers`); the pod's name
//! and namespace are not in the file, and are empty (a UID is not a name, so it is not put there).

use std::fmt::Write as _;
use std::path::Path;

use hami_tool::inspect::{MonitorView, Report};

/// The label every series carries: the monitor registers its collector under
/// `WrapRegistererWith({"zone": "vGPU"})` (cmd/vGPUmonitor/main.go).
const ZONE: &str = "vGPU";
/// The bytes of the UUID entry the monitor puts in `device_uuid` (`DeviceUUID(i)[0:40]`).
const UUID_LABEL_LEN: usize = 40;

/// One metric family: name, help, and how its value comes out of a device. All are gauges.
struct Family {
    name: &'static str,
    help: &'static str,
    value: fn(&Series) -> Option<u64>,
}

/// What one device contributes: the monitor's sums, its limit, the region's last kernel time.
struct Series {
    view: MonitorView,
    limit: u64,
    /// Seconds since the last kernel; `None` where the monitor sends nothing (time ≤ 0).
    last_kernel_elapsed: Option<u64>,
}

/// In the order of their names, as the monitor's registry writes them.
const FAMILIES: [Family; 8] = [
    Family {
        name: "hami_container_device_memory_bytes",
        help: "Container device memory usage in bytes",
        value: |s| Some(s.view.usage.total),
    },
    Family {
        name: "hami_container_device_utilization_ratio",
        help: "Container device SM utilization ratio",
        value: |s| Some(s.view.sm_util),
    },
    Family {
        name: "hami_container_last_kernel_elapsed_seconds",
        help: "Seconds since last kernel execution in container",
        value: |s| s.last_kernel_elapsed,
    },
    Family {
        name: "hami_vgpu_memory_buffer_bytes",
        help: "Container device memory buffer size in bytes",
        value: |s| Some(s.view.usage.data),
    },
    Family {
        name: "hami_vgpu_memory_context_bytes",
        help: "Container device memory context size in bytes",
        value: |s| Some(s.view.usage.context),
    },
    Family {
        name: "hami_vgpu_memory_limit_bytes",
        help: "vGPU device memory limit in bytes",
        value: |s| Some(s.limit),
    },
    Family {
        name: "hami_vgpu_memory_module_bytes",
        help: "Container device memory module size in bytes",
        value: |s| Some(s.view.usage.module),
    },
    Family {
        name: "hami_vgpu_memory_used_bytes",
        help: "vGPU device memory usage in bytes",
        value: |s| Some(s.view.usage.total),
    },
];

/// The container's name from the region's directory, `<pod-uid>_<container>` split at the first
/// `_` as the monitor's `ContainerLister.Update` does; empty where the directory is not so named
/// (inside a container the region sits in `/tmp` or `/tmp/vgpu`).
pub fn container_of(path: &Path) -> String {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    match name.as_deref().and_then(|n| n.split_once('_')) {
        Some((uid, ctr)) if !uid.is_empty() && !ctr.is_empty() => ctr.to_owned(),
        _ => String::new(),
    }
}

/// A label value escaped for the text format: backslash, double quote and newline.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The exposition of `report` for the container named `container`, at `now` (epoch seconds).
/// Devices are those the monitor reports: index below `device_num`, a UUID that is set and whose
/// first 40 bytes are UTF-8. The label is the UUID text without the NULs that the monitor keeps
/// when a UUID is shorter than 40 bytes (NVIDIA's are exactly 40).
pub fn render(report: &Report, container: &str, now: i64) -> String {
    let lkt = report.last_kernel_time as i64;
    let last_kernel_elapsed = (lkt > 0).then(|| now.saturating_sub(lkt).max(0) as u64);
    let series: Vec<(String, Series)> = report
        .devices
        .iter()
        .filter(|d| (d.index as u64) < report.device_num && !d.uuid_bytes.is_empty())
        .filter_map(|d| {
            let head = &d.uuid_bytes[..d.uuid_bytes.len().min(UUID_LABEL_LEN)];
            let uuid = std::str::from_utf8(head).ok()?;
            let labels = format!(
                "container=\"{}\",device_uuid=\"{}\",namespace=\"\",pod=\"\",\
                 vdevice_index=\"{}\",zone=\"{ZONE}\"",
                escape(container),
                escape(uuid),
                d.index
            );
            let s = Series {
                view: report.monitor_view(d.index),
                limit: d.limit,
                last_kernel_elapsed,
            };
            Some((labels, s))
        })
        .collect();
    let mut o = String::new();
    for f in &FAMILIES {
        let samples: Vec<(&String, u64)> = series
            .iter()
            .filter_map(|(labels, s)| (f.value)(s).map(|v| (labels, v)))
            .collect();
        if samples.is_empty() {
            continue;
        }
        let _ = writeln!(o, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(o, "# TYPE {} gauge", f.name);
        for (labels, v) in samples {
            let _ = writeln!(o, "{}{{{labels}}} {v}", f.name);
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_comes_from_a_directory_named_as_the_monitors() {
        let p = Path::new("/nonexistent/containers/0a1b-uid_my_ctr/x.cache");
        assert_eq!(container_of(p), "my_ctr");
        assert_eq!(container_of(Path::new("/nonexistent/tmp/vgpu/x.cache")), "");
        assert_eq!(container_of(Path::new("/nonexistent/_ctr/x.cache")), "");
        assert_eq!(container_of(Path::new("/nonexistent/uid_/x.cache")), "");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn families_are_sorted_by_name() {
        let names: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
    }
}

//! gres.conf `File=` for every GPU GRES: the nodes' `Gres=` (slurm.conf `NodeName=` lines) against
//! gres.conf's `Name=gpu` lines (with `NodeName=` and ranges like `/dev/nvidia[0-7]`). Without a
//! device file per GPU, `ConstrainDevices=yes` has nothing to hide: the runbook's "user sees more
//! GPUs than allocated".

use std::collections::BTreeMap;

use super::slurm::Read;
use super::{Finding, Severity, Status, conf_pairs};

/// Expands a Slurm host list or file list: `node[01-03,7]` → node01 node02 node03 node7;
/// top-level commas separate entries. `None` when a range is malformed.
pub fn expand(list: &str) -> Option<Vec<String>> {
    let mut out = vec![];
    let mut depth = 0;
    let mut start = 0;
    let b = list.as_bytes();
    for (k, &c) in b.iter().enumerate() {
        match c {
            b'[' => depth += 1,
            b']' => depth -= 1,
            b',' if depth == 0 => {
                out.extend(expand_one(&list[start..k])?);
                start = k + 1;
            }
            _ => {}
        }
    }
    out.extend(expand_one(&list[start..])?);
    Some(out.into_iter().filter(|s| !s.is_empty()).collect())
}

fn expand_one(s: &str) -> Option<Vec<String>> {
    let Some(open) = s.find('[') else { return Some(vec![s.to_string()]) };
    let close = open + s[open..].find(']')?;
    let (head, body, tail) = (&s[..open], &s[open + 1..close], &s[close + 1..]);
    let tails = expand_one(tail)?;
    let mut out = vec![];
    for part in body.split(',') {
        let (a, z) = part.split_once('-').unwrap_or((part, part));
        let (x, y): (u64, u64) = (a.trim().parse().ok()?, z.trim().parse().ok()?);
        if y < x || y - x > 100_000 {
            return None;
        }
        let width = a.trim().len();
        for n in x..=y {
            for t in &tails {
                out.push(format!("{head}{n:0width$}{t}"));
            }
        }
    }
    Some(out)
}

/// GPUs in a `Gres=` value: `gpu:8`, `gpu:a100:4(S:0-1),gpu:v100:2`, `gpu` (one).
pub fn gpus(gres: &str) -> u64 {
    gres.split(',')
        .filter(|g| g.split(':').next() == Some("gpu"))
        .map(|g| {
            let g = g.split('(').next().unwrap_or(g);
            match g.rsplit(':').next().and_then(|n| n.parse::<u64>().ok()) {
                Some(n) if g.contains(':') => n,
                _ => 1,
            }
        })
        .sum()
}

/// GPUs per node from slurm.conf's `NodeName=` lines (`NodeName=DEFAULT` sets a default).
pub fn node_gpus(slurm_conf: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut default = 0;
    for line in slurm_conf.lines() {
        let pairs = conf_pairs(line);
        let Some((_, names)) = pairs.iter().find(|(k, _)| k == "nodename") else { continue };
        let n = pairs.iter().find(|(k, _)| k == "gres").map(|(_, v)| gpus(v));
        if names.eq_ignore_ascii_case("default") {
            default = n.unwrap_or(default);
            continue;
        }
        for node in expand(names).unwrap_or_else(|| vec![names.clone()]) {
            out.insert(node, n.unwrap_or(default));
        }
    }
    out.retain(|_, n| *n > 0);
    out
}

/// Per node: GPU device files gres.conf gives it, and whether AutoDetect finds them instead.
fn gres_files(gres_conf: &str, nodes: &[String]) -> (BTreeMap<String, u64>, Vec<String>) {
    let mut files: BTreeMap<String, u64> = nodes.iter().map(|n| (n.clone(), 0)).collect();
    let mut autodetect = vec![];
    for line in gres_conf.lines() {
        let pairs: BTreeMap<String, String> = conf_pairs(line).into_iter().collect();
        let on: Vec<String> = match pairs.get("nodename") {
            Some(h) => expand(h).unwrap_or_else(|| vec![h.clone()]),
            None => nodes.to_vec(),
        };
        if let Some(a) = pairs.get("autodetect").filter(|a| !a.eq_ignore_ascii_case("off")) {
            autodetect.extend(on.iter().map(|n| format!("{n} (AutoDetect={a})")));
        }
        if pairs.get("name").map(String::as_str) != Some("gpu") {
            continue;
        }
        let n = pairs.get("file").and_then(|f| expand(f)).map_or(0, |v| v.len() as u64);
        for node in on {
            if let Some(c) = files.get_mut(&node) {
                *c += n;
            }
        }
    }
    (files, autodetect)
}

/// The check. `constrain_devices`: whether cgroup.conf has it (a missing `File=` is critical
/// then: the GPUs are counted but nothing can hide them).
pub fn check(slurm_conf: &Read, gres_conf: &Read, constrain_devices: Option<bool>) -> Finding {
    let sev = if constrain_devices == Some(true) { Severity::Critical } else { Severity::Warning };
    let f = Finding::new("slurm.gres.gpu_files", sev, "gres.conf File=")
        .expected("a File= device for every GPU of every node's Gres=")
        .why("ConstrainDevices=yes needs gres.conf File= to know which /dev/nvidiaN is which GRES slot: without it the user sees more GPUs than allocated (security/billing problem) or fewer (jobs fail).")
        .fix("One gres.conf line per GPU type and node set, e.g. NodeName=gpu[01-16] Name=gpu File=/dev/nvidia[0-7] (MIG: one File= per instance), or AutoDetect=nvml; then restart slurmd.");
    let (sc_path, sc) = match slurm_conf {
        Ok(x) => x,
        Err(why) => return f.status(Status::Unknown).at("slurm.conf").note(why.clone()),
    };
    let need = node_gpus(sc);
    if need.is_empty() {
        return f.ok_if(true).at(sc_path.clone()).found("no node has a GPU GRES");
    }
    let (gpath, gtext) = match gres_conf {
        Ok(x) => x,
        Err(why) => return f.status(Status::Unknown).at("gres.conf").note(why.clone()),
    };
    let nodes: Vec<String> = need.keys().cloned().collect();
    let (have, autodetect) = gres_files(gtext, &nodes);
    let short: Vec<String> = need
        .iter()
        .filter(|(n, _)| !autodetect.iter().any(|a| a.starts_with(&format!("{n} "))))
        .filter(|(n, want)| have.get(*n).copied().unwrap_or(0) < **want)
        .map(|(n, want)| format!("{n}: Gres={want} GPUs, {} File=", have.get(n).copied().unwrap_or(0)))
        .collect();
    let found = need
        .iter()
        .map(|(n, want)| format!("{n}: {want} GPUs, {} files", have.get(n).copied().unwrap_or(0)))
        .collect::<Vec<_>>()
        .join("; ");
    f.ok_if(short.is_empty()).found(found).at(format!("{sc_path} + {gpath}")).note_opt(if !short.is_empty() {
        Some(format!("without a File= per GPU: {}", short.join("; ")))
    } else {
        (!autodetect.is_empty()).then(|| format!("devices found by {}", autodetect.join(", ")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_file_lists_expand() {
        assert_eq!(expand("node[01-03,7]").unwrap(), ["node01", "node02", "node03", "node7"]);
        assert_eq!(expand("a,b[1-2]").unwrap(), ["a", "b1", "b2"]);
        assert_eq!(expand("/dev/nvidia[0-7]").unwrap().len(), 8);
        assert_eq!(expand("/dev/nvidia0,/dev/nvidia1").unwrap().len(), 2);
        assert!(expand("n[3-1]").is_none());
        assert_eq!(gpus("gpu:8"), 8);
        assert_eq!(gpus("gpu:a100:4(S:0-1),gpu:v100:2,mps:100"), 6);
    }

    fn read(p: &str, t: &str) -> Read {
        Ok((p.into(), t.into()))
    }

    #[test]
    fn every_gpu_needs_a_file_on_its_node() {
        let sc = read(
            "/etc/slurm/slurm.conf",
            "NodeName=DEFAULT Gres=gpu:8\nNodeName=gpu[01-02] CPUs=8\nNodeName=cpu1 Gres=\n",
        );
        let good = read("/etc/slurm/gres.conf", "NodeName=gpu[01-02] Name=gpu File=/dev/nvidia[0-7]\n");
        let f = check(&sc, &good, Some(true));
        assert_eq!((f.status, f.severity), (Status::Ok, Severity::Critical), "{f:?}");
        let half = read(
            "/etc/slurm/gres.conf",
            "NodeName=gpu01 Name=gpu File=/dev/nvidia[0-7]\nNodeName=gpu02 Name=gpu Count=8\n",
        );
        let f = check(&sc, &half, Some(true));
        assert_eq!(f.status, Status::Finding);
        assert_eq!(f.note.as_deref(), Some("without a File= per GPU: gpu02: Gres=8 GPUs, 0 File="));
        assert_eq!(check(&sc, &half, None).severity, Severity::Warning);
        let auto = read("/etc/slurm/gres.conf", "AutoDetect=nvml\n");
        assert_eq!(check(&sc, &auto, Some(true)).status, Status::Ok);
        let mig = read("/etc/slurm/gres.conf", "Name=gpu Type=a100_1g_10gb File=/dev/nvidia-caps/nvidia-cap1\n");
        let one = read("/etc/slurm/slurm.conf", "NodeName=m1 Gres=gpu:a100_1g_10gb:1\n");
        assert_eq!(check(&one, &mig, Some(true)).status, Status::Ok);
        assert_eq!(check(&Err("x".into()), &good, Some(true)).status, Status::Unknown);
    }
}

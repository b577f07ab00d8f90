//! A fake `weka`, `lfs` and `lctl`: `onramp-fakes` installed (symlinked) under one of those names.
//! It checks its arguments the way the real CLIs' syntax requires, records each call as a JSON
//! array on a line of `calls.jsonl` next to itself, and keeps snapshots in `snapshots/` so that a
//! second create of a name fails like the real one ("already exists"). Quotas it was given are
//! kept in `quotas.json` and listed as the real CLIs list them: `weka fs quota list <fs> --path
//! <p> --all -J` (a JSON array of quota objects, as the REST API returns them) and `lfs quota
//! {-u|-g} <name> <mount>` (the "Disk quotas for …" table, KiB). With a file `ignore-sets`
//! beside it, a quota set succeeds but is not kept (a filesystem that drops it). Anything it does
//! not accept exits 2 with a usage message.
//!
//! A native program, so that a test world's hundreds of calls cost what a real CLI's start costs,
//! not an interpreter's.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// The names it answers to.
pub const NAMES: [&str; 3] = ["weka", "lfs", "lctl"];

/// A call's outcome: what it prints and its exit code.
#[derive(Debug, Default)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    pub code: u8,
}

struct Cli<'a> {
    here: &'a Path,
    prog: &'a str,
}

type Done = Result<String, Output>;

/// Run one call as `prog` (the name it was installed under) with `args`, in the directory
/// `here` (where it was installed). Records the call first, as the real CLIs' audit logs do.
pub fn run(here: &Path, prog: &str, args: &[String]) -> Output {
    let mut line =
        serde_json::to_string(&std::iter::once(prog).chain(args.iter().map(String::as_str)).collect::<Vec<_>>())
            .expect("strings serialize");
    line.push('\n');
    let logged = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(here.join("calls.jsonl"))
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = logged {
        return Output { stderr: format!("{prog}: cannot record the call: {e}\n"), code: 1, ..Output::default() };
    }
    let cli = Cli { here, prog };
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let done = match prog {
        "weka" => cli.weka(&a),
        "lfs" if a.first() == Some(&"quota") => cli.lfs_quota(&a),
        "lfs" => cli.lfs_setquota(&a),
        "lctl" => match a.as_slice() {
            ["snapshot_create", "-F", fs, "-n", name] => cli.snapshot(fs, name),
            _ => Err(cli.usage("usage: lctl snapshot_create -F <fsname> -n <name>")),
        },
        _ => Err(cli.usage("installed under an unknown name")),
    };
    match done {
        Ok(stdout) => Output { stdout, ..Output::default() },
        Err(out) => out,
    }
}

/// The directory a program was started from, by its `argv[0]`: its parent when it names a
/// path, else the first directory on `PATH` that holds it.
pub fn installed_in(argv0: &str) -> PathBuf {
    let p = Path::new(argv0);
    if argv0.contains('/') {
        let dir = p.parent().unwrap_or(Path::new("."));
        return std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .find(|d| d.join(argv0).is_file())
        .unwrap_or_else(|| PathBuf::from("."))
}

fn name_ok(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_lowercase() || f == '_')
        && c.all(|x| x.is_ascii_lowercase() || x.is_ascii_digit() || x == '_' || x == '-')
}

/// The CLIs' size units. Its own table, not onramp's (this crate does not depend on onramp): a
/// unit onramp got wrong would not read back as set.
const UNITS: [(&str, u64); 11] = [
    ("B", 1),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
    ("PB", 1_000_000_000_000_000),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("PiB", 1 << 50),
];

/// `^[1-9][0-9]*(B|KB|…|PiB)$` in bytes.
fn size_bytes(s: &str) -> Option<u64> {
    let digits = s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let (n, unit) = s.split_at(digits);
    if n.is_empty() || n.starts_with('0') {
        return None;
    }
    let mult = UNITS.iter().find(|(u, _)| *u == unit)?.1;
    n.parse::<u64>().ok()?.checked_mul(mult)
}

fn digits(s: &str) -> Option<u64> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten()
}

/// zlib's CRC-32 (as `zlib.crc32`), the fake's stable inode id for a path.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WekaQuota<'a> {
    inode_id: u32,
    path: &'a str,
    total_bytes: u64,
    used_bytes: u64,
    hard_limit_bytes: u64,
    soft_limit_bytes: u64,
    grace_seconds: u64,
    owner: &'a str,
    status: &'a str,
}

type Quotas = BTreeMap<String, [u64; 2]>;

impl Cli<'_> {
    fn usage(&self, msg: &str) -> Output {
        Output { stderr: format!("{}: error: {msg}\n", self.prog), code: 2, ..Output::default() }
    }

    fn failure(msg: String) -> Output {
        Output { stderr: msg + "\n", code: 1, ..Output::default() }
    }

    fn io(e: std::io::Error) -> Output {
        Self::failure(format!("error: {e}"))
    }

    fn weka(&self, a: &[&str]) -> Done {
        match a {
            ["fs", "quota", "set", path, "--hard", hard, "--soft", soft] if path.starts_with('/') => {
                let (Some(h), Some(s)) = (size_bytes(hard), size_bytes(soft)) else {
                    return Err(self.usage(&format!("bad size '{hard}' or '{soft}'")));
                };
                if path.ends_with("/fail") {
                    return Err(Self::failure("error: Directory is not on a Weka filesystem".into()));
                }
                self.keep(path, h, s).map(|()| String::new())
            }
            ["fs", "quota", "set", ..] => {
                Err(self.usage("usage: weka fs quota set <path> --hard <size> --soft <size>"))
            }
            ["fs", "quota", "list", fs, "--path", path, "--all", "-J"] if name_ok(fs) => {
                let q = self.quotas()?;
                let list: Vec<WekaQuota> = q
                    .get(*path)
                    .map(|[hard, soft]| WekaQuota {
                        inode_id: crc32(path.as_bytes()),
                        path,
                        total_bytes: 0,
                        used_bytes: 0,
                        hard_limit_bytes: *hard,
                        soft_limit_bytes: *soft,
                        grace_seconds: 0,
                        owner: "",
                        status: "ACTIVE",
                    })
                    .into_iter()
                    .collect();
                Ok(serde_json::to_string_pretty(&list).expect("quotas serialize") + "\n")
            }
            ["fs", "quota", "list", ..] => {
                Err(self.usage("usage (as onramp calls it): weka fs quota list <fs> --path <path> --all -J"))
            }
            ["fs", "snapshot", "create", fs, name] => self.snapshot(fs, name),
            _ => Err(self.usage("unknown weka command")),
        }
    }

    fn lfs_quota(&self, a: &[&str]) -> Done {
        let usage = || self.usage("usage: lfs quota {-u|-g} <name> <mountpoint>");
        let ["quota", flag @ ("-u" | "-g"), name, mount] = a else {
            return Err(usage());
        };
        if !name_ok(name) || !mount.starts_with('/') {
            return Err(usage());
        }
        let [hard, soft] = self.quotas()?.get(&a[1..].join(" ")).copied().unwrap_or([0, 0]);
        let (kind, idk) = if *flag == "-u" { ("usr", "uid") } else { ("grp", "gid") };
        let mut out = format!("Disk quotas for {kind} {name} ({idk} 5003):\n");
        out += "     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace\n";
        let row = |fs: &str| {
            format!("{fs:>15} {:>7} {:>8} {:>8}       -       1       0       0       -\n", 4, soft / 1024, hard / 1024)
        };
        if mount.len() > 15 {
            out += &format!("{mount}\n");
            out += &row("");
        } else {
            out += &row(mount);
        }
        Ok(out)
    }

    fn lfs_setquota(&self, a: &[&str]) -> Done {
        const USAGE: &str = "usage: lfs setquota {-u|-g} <name> -b <soft-kbytes> -B <hard-kbytes> <mountpoint>";
        let ["setquota", flag @ ("-u" | "-g"), name, "-b", soft, "-B", hard, mount] = a else {
            return Err(self.usage(USAGE));
        };
        let kib = |s: &str| digits(s).and_then(|n| n.checked_mul(1024));
        let (Some(soft), Some(hard)) = (kib(soft), kib(hard)) else {
            return Err(self.usage(USAGE));
        };
        if !name_ok(name) || !mount.starts_with('/') {
            return Err(self.usage(USAGE));
        }
        if soft > hard {
            return Err(self.usage("soft limit above hard limit"));
        }
        self.keep(&format!("{flag} {name} {mount}"), hard, soft).map(|()| String::new())
    }

    fn snapshot(&self, fs: &str, name: &str) -> Done {
        if !name_ok(fs) || !name_ok(name) {
            return Err(self.usage(&format!("bad filesystem or snapshot name '{fs}' '{name}'")));
        }
        let dir = self.here.join("snapshots");
        std::fs::create_dir_all(&dir).map_err(Self::io)?;
        let created = std::fs::OpenOptions::new().write(true).create_new(true).open(dir.join(format!("{fs}@{name}")));
        match created {
            Ok(_) => Ok(format!("Snapshot {name} created\n")),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Err(Self::failure(format!("error: Snapshot {name} already exists in filesystem {fs}")))
            }
            Err(e) => Err(Self::io(e)),
        }
    }

    fn quotas(&self) -> Result<Quotas, Output> {
        match std::fs::read_to_string(self.here.join("quotas.json")) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| Self::failure(format!("error: quotas.json: {e}"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Quotas::new()),
            Err(e) => Err(Self::failure(format!("error: quotas.json: {e}"))),
        }
    }

    /// Keep a quota: many workers set quotas at once, as on a real filesystem, so one
    /// read-modify-write at a time (a lock file), replaced atomically.
    fn keep(&self, key: &str, hard: u64, soft: u64) -> Result<(), Output> {
        if self.here.join("ignore-sets").exists() {
            return Ok(());
        }
        let lock = std::fs::File::create(self.here.join("quotas.lock")).map_err(Self::io)?;
        lock.lock().map_err(Self::io)?;
        let mut q = self.quotas()?;
        q.insert(key.to_string(), [hard, soft]);
        let tmp = self.here.join(format!("quotas.json.{}", std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec(&q).expect("quotas serialize")).map_err(Self::io)?;
        std::fs::rename(&tmp, self.here.join("quotas.json")).map_err(Self::io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(dir: &Path, prog: &str, args: &str) -> Output {
        run(dir, prog, &args.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn crc32_is_zlibs() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn sizes_follow_the_cli_syntax() {
        assert_eq!(size_bytes("100GB"), Some(100_000_000_000));
        assert_eq!(size_bytes("2KiB"), Some(2048));
        for bad in ["0GB", "GB", "10", "10gb", "10 GB", "01GB", "-1GB"] {
            assert_eq!(size_bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_weka_quota_is_kept_listed_and_a_second_snapshot_refused() {
        let d = tempfile_dir();
        assert_eq!(call(&d, "weka", "fs quota set /h/alice --hard 1GB --soft 900MB").code, 0);
        let out = call(&d, "weka", "fs quota list home --path /h/alice --all -J");
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v[0]["hardLimitBytes"], 1_000_000_000u64);
        assert_eq!(v[0]["softLimitBytes"], 900_000_000u64);
        assert_eq!(v[0]["path"], "/h/alice");
        let none = call(&d, "weka", "fs quota list home --path /h/bob --all -J");
        assert_eq!(none.stdout.trim(), "[]");
        assert_eq!(call(&d, "weka", "fs snapshot create home s1").stdout, "Snapshot s1 created\n");
        let again = call(&d, "weka", "fs snapshot create home s1");
        assert_eq!((again.code, again.stderr.as_str()), (1, "error: Snapshot s1 already exists in filesystem home\n"));
        assert_eq!(call(&d, "weka", "fs quota set relative --hard 1GB --soft 1GB").code, 2);
        assert_eq!(call(&d, "weka", "fs quota set /x/fail --hard 1GB --soft 1GB").code, 1);
        assert_eq!(call(&d, "weka", "nonsense").code, 2);
        let calls = std::fs::read_to_string(d.join("calls.jsonl")).unwrap();
        assert_eq!(calls.lines().count(), 8);
        assert!(calls.starts_with(r#"["weka","fs","quota","set","/h/alice","--hard","1GB","--soft","900MB"]"#));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn lustre_quotas_read_back_in_kib_and_long_mounts_wrap() {
        let d = tempfile_dir();
        assert_eq!(call(&d, "lfs", "setquota -u alice -b 900 -B 1000 /lustre").code, 0);
        assert_eq!(call(&d, "lfs", "setquota -u alice -b 1001 -B 1000 /lustre").code, 2);
        let out = call(&d, "lfs", "quota -u alice /lustre").stdout;
        let row = out.lines().nth(2).unwrap();
        assert_eq!(row.split_whitespace().take(4).collect::<Vec<_>>(), ["/lustre", "4", "900", "1000"]);
        let long = call(&d, "lfs", "quota -g tenant-foo /lustre/tenants/tenant-foo/scratch").stdout;
        assert_eq!(long.lines().nth(2), Some("/lustre/tenants/tenant-foo/scratch"));
        assert!(long.starts_with("Disk quotas for grp tenant-foo (gid 5003):\n"));
        std::fs::write(d.join("ignore-sets"), "").unwrap();
        assert_eq!(call(&d, "lfs", "setquota -u bob -b 1 -B 1 /lustre").code, 0);
        assert!(call(&d, "lfs", "quota -u bob /lustre").stdout.contains("       0        0"));
        assert_eq!(call(&d, "lctl", "snapshot_create -F home -n s1").code, 0);
        assert_eq!(call(&d, "lctl", "snapshot_create -F Home -n s1").code, 2);
        assert_eq!(call(&d, "other", "x").code, 2);
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "onramp-storage-cli-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

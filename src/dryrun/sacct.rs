//! The simulated host's accounting exports: `sacct` (a simulation has run no jobs, so it shows
//! no records), the export script writing sacct's header to its file, and `sha256sum` and
//! `wc -l` reading the file back. The file's name joins its directory's listing (`ls`).

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};

use crate::backends::exec::Output;
use crate::backends::slurm::export::EXPORT_SCRIPT;

/// Files the simulated export wrote, by path.
#[derive(Clone, Debug, Default)]
pub struct Exports {
    files: BTreeMap<String, String>,
}

fn ok(stdout: String) -> Output {
    Output { code: 0, stdout, stderr: String::new() }
}

fn missing(program: &str, path: &str) -> Output {
    Output { code: 1, stdout: String::new(), stderr: format!("{program}: {path}: No such file or directory\n") }
}

/// What sacct prints for no records: the header of its `--format`, unless `--noheader`.
fn sacct(args: &[String]) -> String {
    if args.iter().any(|a| a == "--noheader" || a == "-n") {
        return String::new();
    }
    let format = args.iter().find_map(|a| a.strip_prefix("--format=")).unwrap_or("JobID");
    format!("{}\n", format.split(',').collect::<Vec<_>>().join("|"))
}

impl Exports {
    /// Answers the command when it is one of these; `dirs` are the host's directory listings.
    pub fn run(&mut self, argv: &[String], dirs: &mut BTreeMap<String, BTreeSet<String>>) -> Option<Output> {
        let last = argv.last().cloned().unwrap_or_default();
        Some(match argv[0].as_str() {
            "sacct" => ok(sacct(&argv[1..])),
            "sh" if argv.get(2).map(String::as_str) == Some(EXPORT_SCRIPT) && argv.len() > 5 => {
                let path = argv[4].clone();
                if argv[5] != "sacct" {
                    return Some(Output { code: 1, stdout: String::new(), stderr: "not simulated\n".into() });
                }
                if let Some((dir, name)) = path.rsplit_once('/') {
                    dirs.entry(dir.to_string()).or_default().insert(name.to_string());
                }
                self.files.insert(path, sacct(&argv[6..]));
                ok(String::new())
            }
            "sha256sum" => match self.files.get(&last) {
                Some(text) => ok(format!("{:x}  {last}\n", Sha256::digest(text.as_bytes()))),
                None => missing("sha256sum", &last),
            },
            "wc" => match self.files.get(&last) {
                Some(text) => ok(format!("{} {last}\n", text.lines().count())),
                None => missing("wc", &last),
            },
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::slurm::HostPath;
    use crate::backends::slurm::JobScope;
    use crate::backends::slurm::export::{SACCT_FIELDS, export, line_count, parse_rows, parse_sha256, sha256sum};
    use crate::domain::names::{ClusterName, SlurmAccount};

    #[test]
    fn an_export_holds_the_header_and_reads_back() {
        let (mut x, mut dirs) = (Exports::default(), BTreeMap::new());
        let p = HostPath::parse("/archive/offboard-final-foo-20261201.sacct").unwrap();
        let a = SlurmAccount::parse("tenant-foo").unwrap();
        let cluster = ClusterName::parse("production").unwrap();
        let cmd = export(&cluster, &JobScope::Account(a.clone()), &[a], &p);
        assert!(x.run(cmd.argv(), &mut dirs).unwrap().success());
        assert!(dirs["/archive"].contains("offboard-final-foo-20261201.sacct"));
        let sum = x.run(sha256sum(&p).argv(), &mut dirs).unwrap();
        let want = format!("{:x}", Sha256::digest(format!("{}\n", SACCT_FIELDS.replace(',', "|"))));
        assert_eq!(parse_sha256("", &sum.stdout).unwrap(), want);
        assert_eq!(parse_rows("", &x.run(line_count(&p).argv(), &mut dirs).unwrap().stdout).unwrap(), 0);
        let gone = HostPath::parse("/archive/nothing").unwrap();
        assert!(x.run(sha256sum(&gone).argv(), &mut dirs).unwrap().stderr.contains("No such file"));
    }
}

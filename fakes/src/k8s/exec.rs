//! The fake API server's exec endpoint: a WebSocket (v4/v5 channel protocol) that runs the
//! requested argv as a local process and streams its real output and exit code.
//!
//! Pods differ by their files: a pod annotated `fake.onramp.dev/files: DIR` runs its execs in a
//! private mount namespace where each top-level directory of DIR is laid over the same path (a
//! read-only overlayfs: DIR/etc/nslcd.conf is /etc/nslcd.conf, the rest of /etc shows through),
//! and DIR/proc, if any, replaces /proc (a tmpfs holding its files, e.g. a `mounts` table). This
//! needs root (CAP_SYS_ADMIN), as the tests run.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{Method, Uri};
use axum::response::Response;
use serde_json::json;
use tokio::io::AsyncReadExt;

use super::rest::{apply_fault, forbidden, query_pairs, status, take_fault};
use super::{Access, Exec, Fault, Inner};

pub(super) async fn exec(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path((ns, pod)): Path<(String, String)>,
    uri: Uri,
    ws: WebSocketUpgrade,
) -> Response {
    for verb in ["get", "create"] {
        let access = Access { verb: verb.into(), resource: "pods/exec".into(), namespace: Some(ns.clone()) };
        inner.lock().unwrap().log.push((Method::GET, uri.to_string(), access));
    }
    let create = Access { verb: "create".into(), resource: "pods/exec".into(), namespace: Some(ns.clone()) };
    if let Some(r) = forbidden(&inner, &create, Some(&pod)) {
        return r;
    }
    // Faults match the path with its query, so a test can aim at one command (`command=mv`).
    let fault = take_fault(&inner, &Method::GET, &uri.to_string());
    let drop_mid_stream = matches!(fault, Some(Fault::DropExec));
    if let Some(r) = apply_fault(fault).await {
        return r;
    }
    if !inner.lock().unwrap().objects.contains_key(&format!("/api/v1/namespaces/{ns}/pods/{pod}")) {
        return status(404, "NotFound", &format!("pods \"{pod}\" not found"));
    }
    let argv: Vec<String> = query_pairs(&uri).into_iter().filter(|(k, _)| k == "command").map(|(_, v)| v).collect();
    if argv.is_empty() {
        return status(400, "BadRequest", "you must specify at least 1 command");
    }
    let protocols = inner.lock().unwrap().protocols.clone();
    let files = inner
        .lock()
        .unwrap()
        .objects
        .get(&format!("/api/v1/namespaces/{ns}/pods/{pod}"))
        .and_then(|p| p["metadata"]["annotations"][FILES].as_str().map(str::to_string));
    let run_argv = match files {
        Some(dir) => in_pod_files(&dir, &argv),
        None => argv.clone(),
    };
    let mut record = Exec { namespace: ns, pod, argv, code: None };
    ws.protocols(protocols).on_upgrade(move |socket| async move {
        record.code = run(socket, &run_argv, drop_mid_stream).await;
        inner.lock().unwrap().execs.push(record);
    })
}

/// The annotation naming a pod's own files (see the module's doc).
pub const FILES: &str = "fake.onramp.dev/files";

/// `argv` in a private mount namespace with `dir`'s files laid over the system's.
fn in_pod_files(dir: &str, argv: &[String]) -> Vec<String> {
    const SCRIPT: &str = r#"d=$1; shift
for top in "$d"/*; do
  [ -d "$top" ] || continue
  name=${top##*/}
  if [ "$name" = proc ]; then
    mount -t tmpfs fake-proc /proc && cp -R "$top"/. /proc/ || exit 125
  else
    mount -t overlay fake-files -o "lowerdir=$top:/$name" "/$name" || exit 125
  fi
done
exec "$@""#;
    let head = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", SCRIPT, "sh", dir];
    head.iter().map(|s| s.to_string()).chain(argv.iter().cloned()).collect()
}

/// Runs `argv`, streaming its output; its exit code, or `None` when it ended without one.
async fn run(mut socket: WebSocket, argv: &[String], drop_mid_stream: bool) -> Option<i32> {
    let child = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            let s = json!({"metadata": {}, "status": "Failure", "reason": "InternalError", "code": 500,
                "message": format!("Internal error occurred: error executing command in container: exec: \"{}\": {e}", argv[0])});
            let _ = socket.send(Message::Binary(channel(3, s.to_string().as_bytes()))).await;
            close(socket).await;
            return None;
        }
    };
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let (mut ob, mut eb) = ([0u8; 4096], [0u8; 4096]);
    let (mut out_open, mut err_open) = (true, true);
    while out_open || err_open {
        let (ch, n) = tokio::select! {
            r = out.read(&mut ob), if out_open => (1u8, r.unwrap_or(0)),
            r = err.read(&mut eb), if err_open => (2u8, r.unwrap_or(0)),
            // Read what the client sends meanwhile (v5 stdin close `[255, 0]`, pings): leaving
            // it unread would make our close a reset that loses the status.
            m = socket.recv() => match m {
                Some(Ok(_)) => continue,
                _ => return None,
            },
        };
        if n == 0 {
            if ch == 1 {
                out_open = false
            } else {
                err_open = false
            }
            continue;
        }
        let data = if ch == 1 { &ob[..n] } else { &eb[..n] };
        if socket.send(Message::Binary(channel(ch, data))).await.is_err() {
            return None;
        }
        if drop_mid_stream {
            // Drop the connection without a close frame or a status, as a dying proxy would.
            drop(socket);
            return None;
        }
    }
    let code = child.wait().await.map(|s| s.code().unwrap_or(-1)).unwrap_or(-1);
    let st = if code == 0 {
        json!({"metadata": {}, "status": "Success"})
    } else {
        json!({"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": format!("command terminated with non-zero exit code: error executing command [{}], exit code {code}", argv.join(" ")),
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}})
    };
    let _ = socket.send(Message::Binary(channel(3, st.to_string().as_bytes()))).await;
    close(socket).await;
    Some(code)
}

/// Sends a close frame and waits until the client has gone, as an API server does: closing the
/// TCP connection with the client's frames unread would reset it and could lose the status.
async fn close(mut socket: WebSocket) {
    let _ = socket.send(Message::Close(None)).await;
    let drain = async { while let Some(Ok(_)) = socket.recv().await {} };
    let _ = tokio::time::timeout(Duration::from_secs(10), drain).await;
}

fn channel(ch: u8, data: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(ch);
    v.extend_from_slice(data);
    v.into()
}

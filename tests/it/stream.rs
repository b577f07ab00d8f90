//! /v1/stream (issue #15): each `job` event carries the id of its change in the audit trail;
//! a client reconnecting with `Last-Event-ID` is sent what it missed first; `?tenant=` and
//! `?job=` narrow the stream.

use std::time::Duration;

use onramp::app::world::World;
use onramp::engine::{Actor, Engine, NewJob};
use onramp::http::access::Role;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::http_api::token;

struct App {
    base: String,
    engine: Engine,
    http: reqwest::Client,
    token: String,
    stop: CancellationToken,
    _db: TestDb,
}

impl Drop for App {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn app() -> App {
    let db = TestDb::new().await;
    let engine = engine(&db, onramp::flows::registry());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let world = World::bare(engine.clone());
    let s = stop.clone();
    tokio::spawn(async move { world.run(Some(listener), None, s).await.unwrap() });
    let token = token(&engine, "viewer", Role::Viewer, None).await;
    App { base, engine, http: reqwest::Client::new(), token, stop, _db: db }
}

impl App {
    async fn open(&self, query: &str, last: Option<i64>) -> Stream {
        let mut req = self.http.get(format!("{}/v1/stream{query}", self.base)).bearer_auth(&self.token);
        if let Some(id) = last {
            req = req.header("last-event-id", id.to_string());
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        Stream { res, text: String::new() }
    }

    /// A job due in an hour (no worker runs here): its creation is one event.
    async fn job(&self, subject: &str) -> i64 {
        let at = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
        let job = NewJob::new("selftest", subject, json!({}), Actor::cli("test")).at(at);
        self.engine.enqueue(&[job]).await.unwrap()[0].id
    }

    async fn cancel(&self, id: i64) {
        self.engine.cancel(id, &Actor::cli("test"), None).await.unwrap();
    }

    /// The id of the newest change of `job`.
    async fn last_event(&self, job: i64) -> i64 {
        self.engine.events(job).await.unwrap().last().unwrap().id
    }
}

struct Stream {
    res: reqwest::Response,
    text: String,
}

/// One `job` event: its id and the job.
#[derive(Debug)]
struct Sent {
    id: i64,
    job: Value,
}

impl Stream {
    async fn next(&mut self) -> Sent {
        let read = async {
            loop {
                while let Some(end) = self.text.find("\n\n") {
                    let block: String = self.text.drain(..end + 2).collect();
                    let field = |name: &str| block.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
                    if field("event:") != Some("job") {
                        continue; // a keep-alive comment
                    }
                    let id = field("id:").expect("every job event has an id").parse().unwrap();
                    let job = serde_json::from_str(field("data:").unwrap()).unwrap();
                    return Sent { id, job };
                }
                let chunk = self.res.chunk().await.unwrap().expect("the stream goes on");
                self.text.push_str(&String::from_utf8_lossy(&chunk));
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read).await.expect("an event within 10s")
    }

    /// Events until one of the job with `subject`, that one included.
    async fn until(&mut self, subject: &str) -> Vec<Sent> {
        let mut out = vec![];
        loop {
            let e = self.next().await;
            let done = e.job["subject"] == subject;
            out.push(e);
            if done {
                return out;
            }
        }
    }
}

fn subjects(sent: &[Sent]) -> Vec<&str> {
    sent.iter().map(|e| e.job["subject"].as_str().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_carry_their_ids_and_the_filters_narrow_the_stream() {
    let a = app().await;
    let x = a.job("foo/x").await;
    let mut all = a.open("", None).await;
    let mut foo = a.open("?tenant=foo", None).await;
    let mut only_x = a.open(&format!("?job={x}"), None).await;
    a.cancel(x).await;
    let (fa, bb) = (a.job("foo/a").await, a.job("bar/b").await);
    a.job("bar/end").await;
    let end = a.job("foo/end").await;

    let sent = all.until("foo/end").await;
    assert_eq!(subjects(&sent), ["foo/x", "foo/a", "bar/b", "bar/end", "foo/end"]);
    assert!(sent.windows(2).all(|w| w[0].id < w[1].id), "{sent:?}");
    assert_eq!(sent[0].id, a.last_event(x).await);
    assert_eq!(sent[0].job["state"], "cancelled");
    assert_eq!((sent[1].id, sent[2].id), (a.last_event(fa).await, a.last_event(bb).await));

    let sent = foo.until("foo/end").await;
    assert_eq!(subjects(&sent), ["foo/x", "foo/a", "foo/end"]);
    assert_eq!(sent[2].id, a.last_event(end).await);

    let sent = only_x.next().await;
    assert_eq!((sent.id, sent.job["id"].as_i64()), (a.last_event(x).await, Some(x)));

    // filters and Last-Event-ID that are not what they should be: 400 with the reason
    for (query, last) in [("?tenant=Not%20a%20tenant", None), ("?job=abc", None), ("", Some("abc"))] {
        let mut req = a.http.get(format!("{}/v1/stream{query}", a.base)).bearer_auth(&a.token);
        if let Some(l) = last {
            req = req.header("last-event-id", l);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{query} {last:?}");
        let body: Value = res.json().await.unwrap();
        assert!(!body["detail"].as_str().unwrap().is_empty(), "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reconnecting_with_last_event_id_is_sent_what_it_missed_first() {
    let a = app().await;
    let mut s = a.open("", None).await;
    let first = a.job("foo/first").await;
    let seen = s.next().await;
    assert_eq!(seen.job["id"].as_i64(), Some(first));
    drop(s);
    // while it is away
    let b = a.job("foo/b").await;
    let c = a.job("bar/c").await;
    a.cancel(first).await;

    let mut s = a.open("", Some(seen.id)).await;
    let replayed = vec![s.next().await, s.next().await, s.next().await];
    assert_eq!(subjects(&replayed), ["foo/b", "bar/c", "foo/first"]);
    let ids: Vec<i64> = replayed.iter().map(|e| e.id).collect();
    assert_eq!(ids, [a.last_event(b).await, a.last_event(c).await, a.last_event(first).await]);
    assert_eq!(replayed[2].job["state"], "cancelled");
    // then the live ones
    a.job("foo/live").await;
    assert_eq!(s.next().await.job["subject"], "foo/live");

    // the replay is narrowed by the filters too; without Last-Event-ID nothing is replayed
    let mut foo = a.open("?tenant=foo", Some(seen.id)).await;
    assert_eq!(subjects(&foo.until("foo/live").await), ["foo/b", "foo/first", "foo/live"]);
    let mut fresh = a.open("", None).await;
    a.job("foo/after").await;
    assert_eq!(fresh.next().await.job["subject"], "foo/after");
}

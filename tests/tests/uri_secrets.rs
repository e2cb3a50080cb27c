//! A secret in a `file://` URI's query (`?password=`, `?token=`) never reaches
//! any output: errors and messages of esdump and espublish (flag or
//! environment), and the Python `Reader`/`Publisher` repr, str and errors.
//! (Redis URIs: `redis_bad_input.rs`.)

use std::process::{Command, Output};

use engine_state_publisher::PublisherConfig;
use engine_state_tests::*;

const SECRET: &str = "hunter2-s3cret";

fn text(out: Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn no_output_for_a_file_uri_with_a_query_secret_contains_it() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().display();
    // One that exists under its literal name (before the fix, the query was
    // part of the directory's name, so it was read and its URI shown), one
    // that does not (its error quoted the directory).
    let live = format!("live?password={SECRET}");
    std::fs::create_dir(dir.path().join(&live)).unwrap();
    let uris = [
        format!("file://{base}/{live}"),
        format!("file://{base}/missing?token={SECRET}"),
        format!("file://{base}/missing?mode=1&api_key={SECRET}"),
        format!("{base}/{live}"),
        format!("file://user:{SECRET}@localhost{base}/d"),
    ];
    let mut outputs: Vec<(String, String)> = Vec::new();
    for uri in &uris {
        let mut said = |what: &str, text: String| outputs.push((format!("{what} {uri}"), text));
        let (what, shown) = parsed_uri_text(uri);
        said(what, shown);
        match PublisherConfig::resolve(Some(uri), Some("x"), None, None) {
            Ok(config) => said("PublisherConfig", format!("{config:?}")),
            Err(e) => said("PublisherConfig::resolve", format!("{e} {e:?}")),
        }
        for args in [&[][..], &["--json"][..], &["--watch", "--count", "1"][..]] {
            let flag = Command::new(bin("esdump"))
                .args(args)
                .args(["--uri", uri])
                .output();
            said("esdump --uri", text(flag.unwrap()));
            let env = Command::new(bin("esdump"))
                .args(args)
                .env("AGENTIC_ENGINE_STATE_URI", uri)
                .output();
            said("esdump env", text(env.unwrap()));
        }
        // Refused at start: espublish never gets to publish.
        let espublish = Command::new(bin("espublish"))
            .args(["--uri", uri, "--engine-id", "x", "--duration", "0.2"])
            .output();
        said("espublish", text(espublish.unwrap()));
    }
    let script = "import sys\nfrom engine_state import Reader, Publisher\n\
         for uri in sys.argv[1:]:\n\
         \x20   for make in (lambda: Reader(uri=uri), lambda: Publisher(uri=uri, engine_id='x')):\n\
         \x20       try:\n\
         \x20           made = make()\n\
         \x20           print(repr(made), str(made), made.uri)\n\
         \x20       except Exception as e:\n\
         \x20           print(type(e).__name__, str(e), repr(e))\n";
    let python = Command::new(python())
        .arg("-c")
        .arg(script)
        .args(&uris)
        .output();
    outputs.push(("python".to_owned(), text(python.unwrap())));
    for (what, text) in &outputs {
        assert!(!text.contains("s3cret"), "{what} leaked the secret: {text}");
    }
    // Real messages, not silence: the refusal says what to do.
    for (what, text) in &outputs {
        if what.starts_with("esdump") || what.starts_with("espublish") {
            let refused = text.contains("query is not allowed in a file URI")
                || text.contains("absolute path");
            assert!(refused, "{what}: {text}");
        }
    }
    let python = &outputs.last().unwrap().1;
    let lines: Vec<&str> = python
        .split_once("stdout: ")
        .and_then(|(_, rest)| rest.split_once("\nstderr: "))
        .map(|(stdout, _)| stdout.lines().collect())
        .unwrap_or_default();
    assert_eq!(lines.len(), 2 * uris.len(), "{python}");
    assert!(
        lines.iter().all(|line| line.starts_with("ValueError")),
        "every one refused as a bad setting: {python}"
    );
    assert!(python.contains("password=***"), "{python}");
}

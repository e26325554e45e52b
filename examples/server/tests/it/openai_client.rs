//! The real `openai` Python package (pinned in `tests/requirements.txt`, installed by
//! `.ci/install-test-deps`) against a server on 127.0.0.1 with an ephemeral port: completion,
//! chat, streaming, the canvas stream, stop strings and errors (`tests/openai_client.py`).
//! Without python3 or the package the test is skipped locally and fails under `CI=true`.

use crate::common;

use std::process::Command;

use common::Server;

#[test]
fn the_openai_python_client_works_unchanged() {
    let probe = Command::new("python3")
        .args(["-c", "import openai; print(openai.__version__)"])
        .output();
    let version = match probe {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => {
            return common::missing_tool(
                "python3 with the `openai` package",
                "pip install -r examples/server/tests/requirements.txt",
            )
        }
    };
    let pinned = include_str!("../requirements.txt");
    assert!(
        pinned.contains(&format!("openai=={version}")),
        "openai {version} is installed, the tests pin {pinned:?}: run .ci/install-test-deps"
    );
    let s = Server::start(&[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("http://{}/v1", s.addr))
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(
        out.status.success(),
        "the openai client checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(" 0 failed"), "{stdout}");
}

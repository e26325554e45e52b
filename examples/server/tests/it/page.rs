//! The page at `/`, driven in Debian's headless Chromium as a person would use it: type a prompt,
//! press Generate, watch the canvas. Chromium is controlled over the DevTools protocol on a pipe
//! (`--remote-debugging-pipe`: commands on fd 3, replies on fd 4; no network port, no websocket).
//! Checks: the final text is the API's answer, every canvas position is coloured by its state with
//! the legend's colour (masked, invisible and stable all seen, four distinct colours), and the
//! forwards and tokens/s are shown.
//!
//! Without `chromium` the test is skipped locally and fails under `CI=true`. With
//! `LLADA_SERVER_SCREENSHOT=<file.png>` it also writes a screenshot taken mid-denoise (the README's).

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use base64::Engine as _;
use common::{Server, TOM};
use serde_json::{json, Value};

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`, which we then own.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just created and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// A headless Chromium under DevTools control, killed when dropped.
struct Browser {
    child: Child,
    to: std::fs::File,
    from: BufReader<std::fs::File>,
    next_id: u64,
    _profile: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Browser {
    fn launch() -> Option<Browser> {
        if Command::new("chromium")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| !s.success())
            .unwrap_or(true)
        {
            return None;
        }
        let profile = std::env::temp_dir().join(format!("llada-page-test-{}", std::process::id()));
        std::fs::create_dir_all(&profile).expect("profile dir");
        let (cmd_r, cmd_w) = pipe();
        let (resp_r, resp_w) = pipe();
        let (a, b) = (cmd_r.as_raw_fd(), resp_w.as_raw_fd());
        let mut cmd = Command::new("chromium");
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-pipe",
            "--window-size=1100,820",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec. The pipe ends
        // are first copied above 10 so that putting them on 3 and 4 cannot clobber each other;
        // dup2 leaves the copies on 3 and 4 open across exec.
        unsafe {
            cmd.pre_exec(move || {
                let a2 = libc::fcntl(a, libc::F_DUPFD, 10);
                let b2 = libc::fcntl(b, libc::F_DUPFD, 10);
                if a2 < 0 || b2 < 0 || libc::dup2(a2, 3) < 0 || libc::dup2(b2, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start chromium");
        drop((cmd_r, resp_w));
        Some(Browser {
            child,
            to: std::fs::File::from(cmd_w),
            from: BufReader::new(std::fs::File::from(resp_r)),
            next_id: 1,
            _profile: TempDir(profile),
        })
    }

    /// Send a command (to a page session when given) and wait for its reply.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.try_call(session, method, params)
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    /// [`Self::call`], with DevTools' error as the `Err`.
    fn try_call(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> Result<Value, Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(0);
        self.to.write_all(&bytes).expect("write to chromium");
        loop {
            let mut buf = Vec::new();
            let n = self
                .from
                .read_until(0, &mut buf)
                .expect("read from chromium");
            assert!(n > 0, "chromium closed the DevTools pipe during {method}");
            buf.pop();
            let v: Value = serde_json::from_slice(&buf).expect("DevTools JSON");
            if v["id"] == id {
                return match v.get("error") {
                    Some(e) => Err(e.clone()),
                    None => Ok(v["result"].clone()),
                };
            }
        }
    }

    /// Evaluate `expr` in the page (awaiting a promise) and return its value. A new target starts
    /// on about:blank and then navigates, which destroys the context an evaluation runs in: that
    /// evaluation is run again in the page (a bounded number of times).
    fn eval(&mut self, session: &str, expr: &str) -> Value {
        for _ in 0..100 {
            match self.try_call(
                Some(session),
                "Runtime.evaluate",
                json!({"expression": expr, "awaitPromise": true, "returnByValue": true}),
            ) {
                Ok(r) => {
                    assert!(r.get("exceptionDetails").is_none(), "page error: {r}");
                    return r["result"]["value"].clone();
                }
                Err(e) if e["message"].as_str().is_some_and(|m| m.contains("context")) => {}
                Err(e) => panic!("Runtime.evaluate: {e}"),
            }
        }
        panic!("the page's context kept being destroyed")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ask it to close (its helper processes go with it), then make sure.
        let _ = self
            .to
            .write_all(b"{\"id\": 999999, \"method\": \"Browser.close\"}\0");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Fill in the form, press Generate, record every state class and its colour on the canvas while
/// it denoises, wait for the end; with `shot` (a number of forwards), resolve early once the canvas
/// shows three states after that many forwards. With `whole`, the page's fetch hands it the whole
/// stream in one read (as a fast model on a busy machine can): every step must still be drawn.
const RUN: &str = r#"
(async (prompt, strategy, delay, shot, whole) => {
  const $ = (id) => document.getElementById(id);
  const realFetch = window.fetch;
  if (whole) {
    window.fetch = async (...args) => {
      const r = await realFetch(...args);
      if (!r.ok || !String(args[0]).includes("/v1/completions")) return r;
      const bytes = new Uint8Array(await r.arrayBuffer());
      const body = new ReadableStream({ start(c) { c.enqueue(bytes); c.close(); } });
      return new Response(body, { status: r.status, headers: r.headers });
    };
  }
  // Bounded waits: a page that never gets there fails the test instead of hanging it.
  const until = (cond, what) => new Promise((resolve, reject) => {
    let tries = 0;
    const t = () => {
      if (cond()) resolve();
      else if (++tries > 6000) reject(new Error("timed out waiting for " + what));
      else setTimeout(t, 20);
    };
    t();
  });
  // The page loaded (a new target may still show about:blank) and its /health call answered.
  await until(() => $("model") && $("model").textContent !== "the model", "/health");
  $("prompt").value = prompt;
  $("strategy").value = strategy;
  $("delay").value = String(delay);
  const seen = {};
  const record = () => {
    for (const el of $("canvas").children) {
      const st = [...el.classList].find((c) => c.startsWith("s-"));
      if (!st) continue;
      (seen[st] = seen[st] || new Set()).add(getComputedStyle(el).backgroundColor);
    }
  };
  const obs = new MutationObserver(record);
  obs.observe($("canvas"), { subtree: true, childList: true, attributes: true, characterData: true });
  $("go").click();
  await until(() => {
    const s = $("status").dataset.state;
    const states = new Set([...$("canvas").children].map((e) => e.className));
    return s === "done" || s === "error"
      || (shot && states.size >= 3 && Number($("forwards").textContent) >= shot);
  }, "the generation");
  record();
  obs.disconnect();
  window.fetch = realFetch;
  const legend = {};
  for (const sw of document.querySelectorAll(".legend .sw")) {
    const st = [...sw.classList].find((c) => c.startsWith("s-"));
    legend[st] = getComputedStyle(sw).backgroundColor;
  }
  const out = {};
  for (const k in seen) out[k] = [...seen[k]];
  return {
    status: $("status").dataset.state, statusText: $("status").textContent,
    final: $("final").textContent, forwards: $("forwards").textContent,
    tps: $("tps").textContent, seen: out, legend,
  };
})"#;

#[test]
fn the_page_shows_the_canvas_denoise_coloured_by_state() {
    let Some(mut b) = Browser::launch() else {
        return common::missing_tool("chromium", "apt-get install chromium");
    };
    let s = Server::start(&[]);
    let answer = s
        .post(
            "/v1/completions",
            &json!({"prompt": TOM, "strategy": "vanilla"}).to_string(),
        )
        .json()["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();

    let target = b.call(
        None,
        "Target.createTarget",
        json!({"url": format!("http://{}/", s.addr)}),
    );
    let attached = b.call(
        None,
        "Target.attachToTarget",
        json!({"targetId": target["targetId"], "flatten": true}),
    );
    let session = attached["sessionId"].as_str().expect("session").to_string();
    b.eval(
        &session,
        "new Promise((r, j) => { let n = 0; const t = () => (document.getElementById('canvas') && document.readyState === 'complete') ? r(true) : (++n > 6000 ? j(new Error('the page did not load')) : setTimeout(t, 20)); t(); })",
    );
    let prompt = serde_json::to_string(TOM).unwrap();
    // Streamed as it comes, then with the whole stream in one read: each step drawn either way.
    for whole in [false, true] {
        let r = b.eval(
            &session,
            &format!("{RUN}({prompt}, 'vanilla', 0, 0, {whole})"),
        );
        assert_eq!(r["status"], "done", "{r}");
        assert_eq!(r["final"], answer.as_str(), "{r}");
        assert!(
            r["forwards"].as_str().unwrap().parse::<u64>().unwrap() > 0,
            "{r}"
        );
        assert!(
            r["tps"].as_str().unwrap().parse::<f64>().unwrap() > 0.0,
            "{r}"
        );
        let legend = r["legend"].as_object().expect("legend");
        let colours: std::collections::BTreeSet<&str> =
            legend.values().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(legend.len(), 4, "{r}");
        assert_eq!(colours.len(), 4, "the four states need four colours: {r}");
        let seen = r["seen"].as_object().expect("seen");
        for st in ["s-masked", "s-invisible", "s-stable"] {
            assert!(
                seen.contains_key(st),
                "{st} never shown (whole: {whole}): {r}"
            );
        }
        for (st, cs) in seen {
            assert_eq!(
                cs.as_array().unwrap(),
                &vec![legend[st].clone()],
                "{st} is drawn in other colours than its legend's: {r}"
            );
        }
    }

    if let Ok(path) = std::env::var("LLADA_SERVER_SCREENSHOT") {
        // The long model under mbsd: a 128-position canvas showing all four states.
        let long = common::model_dir("tiny-llada-long");
        let s = Server::start(&["--model", long.to_str().unwrap()]);
        let target = b.call(
            None,
            "Target.createTarget",
            json!({"url": format!("http://{}/", s.addr)}),
        );
        let attached = b.call(
            None,
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        let session = attached["sessionId"].as_str().expect("session").to_string();
        b.eval(
            &session,
            "new Promise((r, j) => { let n = 0; const t = () => (document.getElementById('canvas') && document.readyState === 'complete') ? r(true) : (++n > 6000 ? j(new Error('the page did not load')) : setTimeout(t, 20)); t(); })",
        );
        let prompt = serde_json::to_string(
            "Tom has 3 apples. In January he buys 4 more. In February he doubles them. \
             In March he eats 2. How many apples does Tom have at the end?",
        )
        .unwrap();
        let r = b.eval(&session, &format!("{RUN}({prompt}, 'mbsd', 400, 5, false)"));
        assert_eq!(r["status"], "running", "{r}");
        let shot = b.call(
            Some(&session),
            "Page.captureScreenshot",
            json!({"format": "png",
                   "clip": {"x": 0, "y": 0, "width": 1100, "height": 520, "scale": 1}}),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("data"))
            .expect("base64");
        std::fs::write(&path, png).expect("write the screenshot");
        eprintln!("wrote {path}");
    }
}

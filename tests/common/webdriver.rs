//! A small W3C WebDriver client over reqwest, for the console's browser
//! test: Debian's chromedriver driving headless Chromium. (fantoccini pulls
//! the `webdriver` crate, and with it warp, hyper 0.14 and ICU: minutes of
//! compiling for the dozen commands this test sends.)

use serde_json::{json, Value};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The WebDriver spec's key for an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process (ours, killed on drop) and one browser session.
pub struct Browser {
    http: reqwest::Client,
    session: String,
    base: String,
    _driver: tokio::process::Child,
    _profile: tempfile::TempDir,
}

pub struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Browser {
    /// Starts `chromedriver` and a headless Chromium session.
    pub async fn start(chromedriver: &str) -> Browser {
        let port = free_port();
        let driver = tokio::process::Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = http.get(format!("{base}/status")).send().await;
            if let Ok(r) = ready {
                let status: Value = r.json().await.unwrap_or_default();
                if status["value"]["ready"] == true {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not become ready"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let binary =
            std::env::var("ONEJOB_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1360,1500",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": binary, "args": args}
        }}});
        let answer: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {answer}"))
            .to_string();
        Browser {
            http,
            session,
            base,
            _driver: driver,
            _profile: profile,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.http.request(method, url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request.send().await.unwrap().json().await.unwrap();
        if answer["value"]["error"].is_string() {
            panic!("WebDriver {path}: {}", answer["value"]);
        }
        answer["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    pub async fn current_url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub async fn find(&self, css: &str) -> Element<'_> {
        let found = self
            .call(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        Element {
            browser: self,
            id: found[ELEMENT]
                .as_str()
                .unwrap_or_else(|| panic!("no element {css}: {found}"))
                .to_string(),
        }
    }

    pub async fn find_all(&self, css: &str) -> Vec<Element<'_>> {
        let found = self
            .call(
                reqwest::Method::POST,
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        found
            .as_array()
            .unwrap()
            .iter()
            .map(|e| Element {
                browser: self,
                id: e[ELEMENT].as_str().unwrap().to_string(),
            })
            .collect()
    }

    /// A PNG of the viewport, written to `path`.
    pub async fn screenshot(&self, path: &std::path::Path) {
        use base64::Engine;
        let data = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().unwrap())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(path, png).unwrap();
    }

    pub async fn quit(self) {
        self.call(reqwest::Method::DELETE, "", None).await;
    }
}

impl Element<'_> {
    fn path(&self, tail: &str) -> String {
        format!("/element/{}{tail}", self.id)
    }

    pub async fn click(&self) {
        self.browser
            .call(reqwest::Method::POST, &self.path("/click"), Some(json!({})))
            .await;
    }

    pub async fn type_text(&self, text: &str) {
        self.browser
            .call(
                reqwest::Method::POST,
                &self.path("/value"),
                Some(json!({ "text": text })),
            )
            .await;
    }

    pub async fn text(&self) -> String {
        self.browser
            .call(reqwest::Method::GET, &self.path("/text"), None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub async fn attribute(&self, name: &str) -> Option<String> {
        self.browser
            .call(
                reqwest::Method::GET,
                &self.path(&format!("/attribute/{name}")),
                None,
            )
            .await
            .as_str()
            .map(str::to_string)
    }
}

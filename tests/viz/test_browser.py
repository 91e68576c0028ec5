"""tests/browser.py, the harness the live lab's tests drive Chromium with: a tiny page served from tmp_path
shows what it fetched, turns its knobs and reaches nothing but 127.0.0.1; closing leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest

from tests.browser import Browser, need_chromium, only_local, serve_folder

# No favicon request: Chromium would otherwise ask the server for /favicon.ico and log its 404.
HEAD = '<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"></head>'
SHOW_DATA = """<body><p id="out">waiting</p><script>
console.log("page ready");
fetch("data.json").then(r => r.json()).then(d => { document.getElementById("out").textContent = d.message; });
</script></body></html>"""
REACH_OUT = """<body><p id="fetched">pending</p><p id="image">pending</p>
<img src="https://cdn.jsdelivr.net/y.png" onload="image.textContent = 'loaded'" onerror="image.textContent = 'failed'">
<script>
const say = text => { fetched.textContent = text; };
fetch("http://example.com/x").then(() => say("reached"), e => say("failed: " + e.message));
</script></body></html>"""
KNOBS = """<body><input id="blocks" type="number" value="4"><select id="mode">
<option value="recompute">recompute</option><option value="swap">swap</option></select>
<button id="go">go</button><p id="seen"></p><script>
const seen = document.getElementById("seen");
document.body.addEventListener("change", e => { seen.textContent += e.target.id + "=" + e.target.value + ";"; });
document.getElementById("go").addEventListener("click", () => { seen.textContent += "go;"; });
</script></body></html>"""
EMPTY_WASM = b"\0asm\1\0\0\0"  # the smallest valid module: magic number and version


@pytest.fixture
def site(tmp_path):
    need_chromium()
    for name, body in {"show.html": SHOW_DATA, "reach.html": REACH_OUT, "knobs.html": KNOBS}.items():
        (tmp_path / name).write_text(HEAD + body)
    (tmp_path / "data.json").write_text(json.dumps({"message": "hello from data.json"}))
    (tmp_path / "empty.wasm").write_bytes(EMPTY_WASM)
    (tmp_path / "module.mjs").write_text("export const x = 1;\n")
    (tmp_path / "bundle.zip").write_bytes(b"PK\5\6" + bytes(18))  # an empty zip archive
    with serve_folder(tmp_path) as server:
        yield server


@pytest.fixture
def browser():
    with Browser() as browser:
        yield browser


def test_wait_for_sees_what_the_page_fetched_and_eval_returns_values(site, browser):
    browser.open(site.url + "show.html")
    assert browser.wait_for("document.getElementById('out').textContent === 'hello from data.json'", timeout=10)
    assert site.paths == ["/show.html", "/data.json"]
    assert browser.requests == [site.url + "show.html", site.url + "data.json"]
    assert ("log", "page ready") in browser.console and browser.errors == []
    # Values come back as JSON gives them; a promise is awaited; undefined is None.
    assert browser.eval("6 * 7") == 42
    assert browser.eval("document.title || 'untitled'") == "untitled"
    assert browser.eval("({blocks: [1, 2], mode: 'swap', on: true})") == {"blocks": [1, 2], "mode": "swap", "on": True}
    assert browser.eval("new Promise(done => setTimeout(() => done('later'), 50))") == "later"
    assert browser.eval("undefined") is None
    # What the page threw, or a promise's rejection, fails the test with its message.
    with pytest.raises(AssertionError, match="Cannot read properties of null"):
        browser.eval("document.getElementById('nothing').textContent")
    with pytest.raises(AssertionError, match="refused"):
        browser.eval("Promise.reject(new Error('refused'))")


def test_wait_for_gives_up_in_time_and_says_what_the_page_said(site, browser):
    browser.open(site.url + "show.html")
    started = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        browser.wait_for("window.neverSet", timeout=0.5)
    assert time.monotonic() - started < 3
    assert "window.neverSet" in str(failed.value) and "page ready" in str(failed.value)


def test_the_page_reaches_nothing_but_127_0_0_1(site, browser):
    browser.open(site.url + "reach.html")
    # Both fail within moments: the flags send them to a proxy nobody listens at, internet or not.
    assert browser.wait_for("fetched.textContent !== 'pending' && image.textContent !== 'pending'", timeout=5)
    assert browser.eval("fetched.textContent") == "failed: Failed to fetch"
    assert browser.eval("image.textContent") == "failed"
    outside = ["http://example.com/x", "https://cdn.jsdelivr.net/y.png"]
    assert sorted(only_local(browser.requests, site.url)) == outside
    assert len(browser.errors) == 2 and all("net::ERR_" in error for error in browser.errors), browser.errors
    assert site.paths == ["/reach.html"]


def test_another_address_of_this_machine_is_outside_too(site, tmp_path, browser):
    # A server on 127.0.0.2 stands for the internet: it is there, and only the flags keep the page from it.
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.2", 0))
        except OSError as e:
            pytest.skip(f"cannot listen on 127.0.0.2 here: {e}")
    with serve_folder(tmp_path, host="127.0.0.2") as elsewhere:
        browser.open(site.url + "show.html")
        # localhost is outside too (its own name, not 127.0.0.1): pages are opened at 127.0.0.1.
        for url in (elsewhere.url, site.url.replace("127.0.0.1", "localhost")):
            got = browser.eval(f"fetch('{url}data.json').then(r => r.status, e => 'failed: ' + e.message)")
            assert got == "failed: Failed to fetch", url
        assert elsewhere.paths == [] and site.paths == ["/show.html", "/data.json"]


def test_set_value_and_click_fire_the_pages_handlers(site, browser):
    browser.open(site.url + "knobs.html")
    browser.set_value("#blocks", 7)
    browser.set_value("#mode", "swap")
    browser.click("#go")
    assert browser.eval("seen.textContent") == "blocks=7;mode=swap;go;"
    with pytest.raises(AssertionError, match="refused the value"):
        browser.set_value("#mode", "no such mode")
    with pytest.raises(AssertionError, match="nothing matches"):
        browser.set_value("#missing", 1)


def test_files_are_served_with_their_mime_types(site, browser):
    browser.open(site.url + "show.html")
    kinds = {"empty.wasm": "application/wasm", "module.mjs": "text/javascript", "data.json": "application/json"}
    kinds["bundle.zip"] = "application/zip"
    for name, kind in kinds.items():
        assert browser.eval(f"fetch('{name}').then(r => r.headers.get('content-type'))") == kind, name
    # The reason it matters: instantiateStreaming refuses a module served as anything but application/wasm.
    assert browser.eval("WebAssembly.instantiateStreaming(fetch('empty.wasm')).then(() => 'compiled')") == "compiled"


def test_close_leaves_no_process_and_no_profile(site):
    browser = Browser()
    browser.open(site.url + "show.html")
    running, folder = browser.processes(), browser.folder
    assert browser.pid in running and len(running) > 2  # the browser, its zygotes, a renderer, ...
    browser.close()
    assert browser.processes() == [] and not folder.exists()
    browser.close()  # twice is harmless


def test_calls_fail_at_once_when_chromium_dies(site):
    with Browser() as browser:
        browser.open(site.url + "show.html")
        os.killpg(browser.pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="Chromium"):
            browser.eval("1", timeout=30)
        assert time.monotonic() - started < 5


def test_only_local_names_what_left_the_base_url():
    urls = ["http://127.0.0.1:8000/lab/", "data:text/plain,x", "blob:http://127.0.0.1:8000/1", "about:blank"]
    urls += ["chrome-error://chromewebdata/", "http://127.0.0.1:8001/lab/", "https://cdn.jsdelivr.net/pyodide.js"]
    assert only_local(urls, "http://127.0.0.1:8000/") == [
        "http://127.0.0.1:8001/lab/",
        "https://cdn.jsdelivr.net/pyodide.js",
    ]

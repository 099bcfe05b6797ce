#!/usr/bin/env python3
"""Check ds_serve's chat page (GET /) in headless Chromium: the page loads, sends a message to
/v1/chat/completions with "stream": true, and shows the streamed answer with its finish reason.

Optional, not part of ctest: needs Debian's `chromium` (apt-get install chromium) and Python's
standard library only. It starts build/tools/ds_serve on a model, opens /?q=TEXT (the page sends
TEXT at once), and drives Chromium over the DevTools protocol on a pipe (--remote-debugging-pipe:
JSON messages separated by NUL bytes on file descriptors 3 and 4, no WebSocket library needed),
asking the page every 100 ms whether the answer is complete.

    python3 scripts/check_chat_page.py [--model DIR] [--tokenizer DIR] [--prompt TEXT]
                                       [--max_tokens N] [--screenshot FILE] [--timeout SECONDS]

Defaults: the tiny LLaMA test model (tests/fixtures/generate/llama_gqa: random weights, so the
answer is random bytes), $DS_BUILD_DIR or build/. Exit 0 when the answer arrived, 1 otherwise.
docs/images/chat_page.png was made with --screenshot.
"""
import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What the page shows: its state (body data-state: streaming / idle), the bubbles, the meta line.
PROBE = """JSON.stringify({
  state: document.body.dataset.state || "",
  bubbles: [...document.querySelectorAll("#log .msg")].map(d => ({
    cls: d.className, text: d.firstChild ? d.firstChild.textContent : "",
    meta: (d.querySelector(".meta") || {}).textContent || ""}))
})"""


class Chromium:
    """Chromium with the DevTools protocol on a pipe."""

    def __init__(self, exe, width, height):
        self.to_r, self.to_w = os.pipe()      # we write commands, Chromium reads fd 3
        self.from_r, self.from_w = os.pipe()  # Chromium writes fd 4, we read replies
        self.buf = b""
        self.next_id = 0
        self.profile = tempfile.mkdtemp(prefix="ds_chat_check_")

        def fds():  # in the child, before the descriptors not in pass_fds are closed
            os.dup2(self.to_r, 3)
            os.dup2(self.from_w, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--remote-debugging-pipe", f"--window-size={width},{height}",
             f"--user-data-dir={self.profile}", "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(self.to_r)
        os.close(self.from_w)
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"],
                                 flatten=True)["sessionId"]

    def call(self, method, session=None, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self.to_w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self.buf:
                chunk = os.read(self.from_r, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def page(self, method, **params):
        return self.call(method, session=self.session, **params)

    def evaluate(self, expr):
        r = self.page("Runtime.evaluate", expression=expr, returnByValue=True)
        return r["result"].get("value")

    def close(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(REPO, "tests/fixtures/generate/llama_gqa"))
    ap.add_argument("--tokenizer")
    ap.add_argument("--prompt", default="Hello")
    ap.add_argument("--max_tokens", type=int, help="the page's max tokens (default: the rest of "
                    "the context)")
    ap.add_argument("--screenshot")
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args()
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        print("check_chat_page: chromium is not installed (apt-get install chromium)",
              file=sys.stderr)
        return 2
    build = os.environ.get("DS_BUILD_DIR", os.path.join(REPO, "build"))
    cmd = [os.path.join(build, "tools", "ds_serve"), "--model", a.model, "--port", "0"]
    if a.tokenizer:
        cmd += ["--tokenizer", a.tokenizer]
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    log = []
    chrome = None
    try:
        port = None
        for line in server.stderr:
            log.append(line)
            m = re.search(r" on http://127\.0\.0\.1:(\d+) ", line)
            if m:
                port = int(m.group(1))
                break
        if not port:
            print("".join(log), file=sys.stderr)
            return 1
        chrome = Chromium(exe, 900, 560)
        chrome.page("Page.enable")
        query = {"q": a.prompt}
        if a.max_tokens:
            query["max_tokens"] = a.max_tokens
        url = f"http://127.0.0.1:{port}/?{urllib.parse.urlencode(query)}"
        chrome.page("Page.navigate", url=url)
        deadline = time.time() + a.timeout
        seen_streaming = False
        view = {}
        while time.time() < deadline:
            time.sleep(0.1)
            try:
                view = json.loads(chrome.evaluate(PROBE) or "{}")
            except RuntimeError:
                continue  # the page is still loading
            seen_streaming |= view.get("state") == "streaming"
            if view.get("state") == "idle" and len(view.get("bubbles", [])) >= 2:
                break
        bubbles = view.get("bubbles", [])
        answer = next((b for b in bubbles if "assistant" in b["cls"]), None)
        ok = (answer is not None and answer["text"] and answer["meta"].startswith("finish: ")
              and bubbles[0]["text"] == a.prompt)
        print(f"check_chat_page: page {url}: {json.dumps(bubbles, ensure_ascii=False)}")
        if a.screenshot:
            png = base64.b64decode(chrome.page("Page.captureScreenshot", format="png")["data"])
            with open(a.screenshot, "wb") as f:
                f.write(png)
            print(f"check_chat_page: screenshot {a.screenshot}")
        if not ok:
            print("check_chat_page: FAIL: no streamed answer with its finish reason",
                  file=sys.stderr)
            return 1
        print(f"check_chat_page: ok: answer of {len(answer['text'])} characters, "
              f"{answer['meta']}{'' if seen_streaming else ' (finished before the first look)'}")
        return 0
    finally:
        if chrome:
            chrome.close()
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())

"""A scraper's CaptchaAI calls, unchanged, going through solveonce.

Nothing here knows about solveonce: HTTPS_PROXY sends the calls through it,
and identical captchas submitted by several workers cost one task. Run by
examples/docker-compose.yml; each worker submits the same image and polls
for the answer the usual way.
"""
import base64
import concurrent.futures
import os
import time

import requests

API = "https://ocr.captchaai.com"
KEY = os.environ["CAPTCHAAI_API_KEY"]
# A tiny PNG; real scrapers send the captcha they were shown.
IMAGE = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108000000003a7e9b55"
    "0000000a49444154789c63f80f0001010100b138f6140000000049454e44ae426082"
)).decode()


def solve(worker: int) -> str:
    r = requests.post(f"{API}/in.php", data={"key": KEY, "method": "base64", "body": IMAGE}, timeout=60)
    print(f"worker {worker}: in.php -> {r.text} ({r.headers.get('X-Solveonce', 'direct')})", flush=True)
    if not r.text.startswith("OK|"):
        return r.text
    task = r.text[3:]
    for _ in range(60):
        time.sleep(5)
        r = requests.get(f"{API}/res.php", params={"key": KEY, "action": "get", "id": task}, timeout=60)
        if r.text != "CAPCHA_NOT_READY":
            print(f"worker {worker}: res.php -> {r.text} ({r.headers.get('X-Solveonce', 'direct')})", flush=True)
            return r.text
    return "timeout"


if __name__ == "__main__":
    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        for answer in pool.map(solve, range(5)):
            print("answer:", answer, flush=True)
    # Other HTTPS traffic is tunnelled untouched (no MITM):
    print("example.com:", requests.get("https://example.com", timeout=30).status_code, flush=True)

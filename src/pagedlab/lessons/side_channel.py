"""Stage 4: a security lesson: a prefix-cache hit is visible to another tenant, who can read a prompt by timing it.

Builds on: `pagedlab serve` (serve/, run here as a subprocess on 127.0.0.1: the real server and its /metrics),
kv/hashing.py (block_extra_keys: cache_salt on block 0).
Read with: chapters/04-prefix-caching.md (A side channel: what a cache hit tells another tenant),
notebooks/04b_prefix_side_channel.ipynb, lessons/salting.py (what per-user salts cost real traffic).

A victim sends a form whose blocks the attacker can enumerate; the attacker reads it back one block at a time:

    victim:   [ system ][ Patient: Juliet ][ Diagnosis: gout ][ Treatment: rest ] ...   (cached after its run)
    probe 1:  [ system ][ Patient: Romeo  ]+1 token   miss: 64 + 1 tokens computed  -> slow first token
    probe 2:  [ system ][ Patient: Juliet ]+1 token   hit:  1 token computed        -> fast first token
    probe 3:  [ system ][ Patient: Juliet ][ Diagnosis: fever ]+1 token  ...         (the next field)

A block hits only if every block before it hits (its hash chains its parent's), so the attacker extends what it
has recovered by one block per field: K probes a field, not K ** fields for the whole form. The extra token keeps
the candidate block off the prompt's last token, which is always computed. Each candidate is probed once, and the
fastest probe wins: a probe caches its own blocks, so only the first try of a candidate says anything.

With `cache_salt` (a string per tenant, folded into block 0's hash) the victim's blocks and the attacker's have
different hashes from the first block on, and no probe can hit the victim's: success falls to chance, 1 / K.

Timing is noisy, so the lesson also reads the server's counters (vllm:prefix_cache_hits_total, in tokens) around
each probe: whether the candidate block hit is then exact, and the tests assert it. Every wait is bounded.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

BLOCK_SIZE = 64  # tokens per block: a miss computes 64 tokens more than a hit
# A random-weight Llama, sized so that one block's prefill costs ~25 ms on one CPU thread (~10 M parameters);
# the bundled model's vocabulary (a character each), so prompts are text and outputs decode.
MODEL_SHAPE = dict(hidden_size=384, intermediate_size=1152, num_hidden_layers=6, num_attention_heads=12,
                   num_key_value_heads=6, head_dim=32, max_position_embeddings=2048)  # fmt: skip
SERVER = dict(stage=5, block_size=BLOCK_SIZE, num_kv_blocks=512, max_num_seqs=4)  # 512 blocks: 75 MB of K/V
START_TIMEOUT = 120.0  # seconds for the server to answer /health (it imports torch and loads the model)
REQUEST_TIMEOUT = 60.0  # seconds for one request

# The form: a system block, then one block per field, each from a list the attacker knows (K = 4 candidates).
FIELDS = (
    ("Patient", ("Juliet Capulet", "Romeo Montague", "Ophelia Polonius", "Hamlet of Denmark")),
    ("Diagnosis", ("gout", "the plague", "a fever", "melancholy")),
    ("Treatment", ("bed rest", "leeches", "a sleeping draught", "exile to Mantua")),
)
QUESTION = "\nSummarize the record."  # the victim's last, partly filled block
CALIBRATION_PAIRS = 4  # miss-then-hit probe pairs on fresh blocks, per trial (what the notebook reports)
NEWLINE = 3  # "\n": the token a probe ends with; the characters are ids 3..67


# -- the model and the server -------------------------------------------------------------------------------------


def write_model(folder: str | Path, seed: int = 0) -> Path:
    """A random-weight Llama of MODEL_SHAPE in Hugging Face format (config, safetensors, the bundled tokenizer)."""
    import shutil

    import torch
    from safetensors.torch import save_file

    from pagedlab.model.config import ModelConfig
    from pagedlab.model.llama import CausalLM
    from pagedlab.model.loader import bundled_model_path

    folder, bundled = Path(folder), bundled_model_path()
    config = json.loads((bundled / "config.json").read_text()) | MODEL_SHAPE
    torch.manual_seed(seed)
    model = CausalLM(ModelConfig.from_dict(config))
    for p in model.parameters():
        if p.dim() > 1:  # norms stay at 1
            torch.nn.init.normal_(p, std=0.02)
    folder.mkdir(parents=True, exist_ok=True)
    weights = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copy(bundled / "tokenizer.json", folder / "tokenizer.json")
    return folder


class LessonServer:
    """`pagedlab serve` in a subprocess on a free port of 127.0.0.1, torch on one thread: the real server, in
    another process than the clients that time it. A context manager; close() stops it (SIGTERM, then kill)."""

    def __init__(self, model: str | Path, start_timeout: float = START_TIMEOUT, **engine):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "pagedlab", "serve", "--model", str(model), "--port", str(self.port)]
        for name, value in (SERVER | engine).items():
            args += ["--" + name.replace("_", "-"), str(value)]
        src = str(Path(__file__).resolve().parents[2])  # this pagedlab, whatever the child's path says
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self._wait_healthy(start_timeout)

    def _wait_healthy(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5):
                    return
            except OSError:
                time.sleep(0.1)
        self.close()
        self.log.seek(0)
        raise RuntimeError(f"the server did not start within {seconds:g} s:\n{self.log.read().decode()[-2000:]}")

    def hit_tokens(self) -> int:
        """vllm:prefix_cache_hits_total: prompt tokens served from the prefix cache since the server started."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("vllm:prefix_cache_hits_total"):
                    return int(float(line.rsplit(" ", 1)[1]))
        raise RuntimeError("/metrics has no vllm:prefix_cache_hits_total")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()

    def __enter__(self) -> LessonServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def first_token_seconds(url: str, prompt: list[int], cache_salt: str | None = None) -> float:
    """POST /v1/completions with stream=true and max_tokens=1; seconds until the first streamed token arrives."""
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True}
    if cache_salt is not None:
        body["cache_salt"] = cache_salt  # vLLM's field, in the body as vLLM takes it
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=REQUEST_TIMEOUT)
    try:
        start = time.perf_counter()
        conn.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"/v1/completions: HTTP {response.status}: {response.read()[:300]!r}")
        for _ in range(1000):  # server-sent events: the first "data:" line carries the first token
            line = response.readline()
            if not line or line.startswith(b"data: {"):
                break
        seconds = time.perf_counter() - start
        response.read()  # the rest of the stream: [DONE]
        return seconds
    finally:
        conn.close()


# -- tenants, the form, probes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """One request, timed and counted."""

    ttft: float  # seconds to the first streamed token, as the client saw them
    hit_tokens: int  # prompt tokens it found in the prefix cache (the server-wide counter's rise)


@dataclass(frozen=True)
class Tenant:
    """A client of the server; `salt` is its cache_salt (None: none, as a server without salting)."""

    server: LessonServer
    salt: str | None = None

    def probe(self, prompt: list[int]) -> Probe:
        """Send `prompt` alone (requests go one at a time: the counter's rise is this request's)."""
        before = self.server.hit_tokens()
        ttft = first_token_seconds(self.server.url, prompt, self.salt)
        return Probe(ttft, self.server.hit_tokens() - before)


@functools.cache
def _tokenizer():
    from pagedlab.model.loader import bundled_model_path
    from pagedlab.model.tokenizer import Tokenizer

    return Tokenizer.from_folder(bundled_model_path())


def encode(text: str) -> list[int]:
    """Token ids of `text` with the bundled model's tokenizer (a character each: ids 3..67), no <bos>."""
    return _tokenizer().encode(text, add_special_tokens=False)


def block(text: str) -> list[int]:
    """`text` padded with spaces to exactly one block."""
    if len(text) > BLOCK_SIZE:
        raise ValueError(f"text: {text!r} is longer than a block ({BLOCK_SIZE} characters)")
    return encode(text.ljust(BLOCK_SIZE))


@dataclass(frozen=True)
class Form:
    """The victim's prompt template: a public system block, then one block per field, each one of K known
    candidates. A new `clinic` is a new system block, so nothing of an earlier trial can hit."""

    clinic: int

    @property
    def system(self) -> list[int]:
        return [0] + encode(f"Clinic {chr(65 + self.clinic % 26)}{self.clinic}: answer from the record.".ljust(63))

    def candidates(self, i: int) -> list[list[int]]:
        name, values = FIELDS[i]
        return [block(f"\n{name}: {v}.") for v in values]

    def prompt(self, secret: tuple[int, ...]) -> list[int]:
        """The victim's whole prompt: system, its value of each field, the question."""
        return self.system + [t for i, v in enumerate(secret) for t in self.candidates(i)[v]] + encode(QUESTION)


# -- the attack ---------------------------------------------------------------------------------------------------


@dataclass
class Trial:
    """One victim, one attack."""

    secret: tuple[int, ...]  # the victim's value of each field (an index into FIELDS' candidates)
    guess: list[int] = field(default_factory=list)  # the attacker's
    requests: int = 0  # the attacker's probes, calibration included
    hit_ttfts: list[float] = field(default_factory=list)  # calibration: probes that hit (repeats)
    miss_ttfts: list[float] = field(default_factory=list)  # calibration: probes that missed (fresh blocks)
    probe_ttfts: list[float] = field(default_factory=list)  # per probe of a field, in order: seconds
    candidate_hits: list[bool] = field(default_factory=list)  # per probe: did its candidate block hit (counters)?
    right_probe: list[bool] = field(default_factory=list)  # per probe: was it the victim's value, after a right prefix?

    @property
    def correct(self) -> int:
        """Fields recovered correctly."""
        return sum(g == s for g, s in zip(self.guess, self.secret))

    def probes(self) -> str:
        """Each probe of a field, in order: its TTFT, * where it was the victim's value, (hit) where it hit."""
        marks = [f"{t * 1e3:.0f} ms{'*' if right else ''}{' (hit)' if hit else ''}"
                 for t, right, hit in zip(self.probe_ttfts, self.right_probe, self.candidate_hits)]  # fmt: skip
        return ", ".join(marks)


def words(values) -> str:
    """A form's values (one index per field), in words."""
    return " / ".join(FIELDS[i][1][v] for i, v in enumerate(values))


def calibrate(attacker: Tenant, form: Form, trial: Trial, rng: random.Random) -> None:
    """What a miss and a hit cost, from the client: fresh random blocks (misses), each sent again (hits),
    interleaved. The attacker needs no victim for this: its own repeats hit its own cache."""
    for _ in range(CALIBRATION_PAIRS):
        prompt = form.system + [rng.randrange(NEWLINE, 68) for _ in range(BLOCK_SIZE)] + [NEWLINE]
        trial.miss_ttfts.append(attacker.probe(prompt).ttft)
        trial.hit_ttfts.append(attacker.probe(prompt).ttft)
        trial.requests += 2


def recover(attacker: Tenant, form: Form, trial: Trial, by_clock: bool = True) -> None:
    """Field by field, after what is recovered so far. By the clock: probe every candidate once and take the
    fastest (a threshold between the calibration's medians would save probes, but one slow hit on a busy machine
    would then cost the field, and every field after it). By the counters: stop at the probe whose candidate
    block hit, which is exact; if none did (salts), take the first candidate, a guess."""
    prefix = form.system
    for i in range(len(FIELDS)):
        for c, candidate in enumerate(form.candidates(i)):
            p = attacker.probe(prefix + candidate + [NEWLINE])  # the candidate is not the prompt's last token
            trial.requests += 1
            hit = p.hit_tokens >= len(prefix) + BLOCK_SIZE
            trial.probe_ttfts.append(p.ttft)
            trial.candidate_hits.append(hit)
            trial.right_probe.append(trial.guess == list(trial.secret[:i]) and c == trial.secret[i])
            if hit and not by_clock:
                break
        if by_clock:
            times = trial.probe_ttfts[-(c + 1) :]  # this field's probes, one per candidate
            trial.guess.append(times.index(min(times)))
        else:
            trial.guess.append(c if hit else 0)
        prefix = prefix + form.candidates(i)[trial.guess[-1]]


def run_trial(server: LessonServer, clinic: int, salted: bool, by_clock: bool = True, seed: int = 0) -> Trial:
    """A victim with a random secret sends its form; an attacker recovers it. `salted`: each has its own
    cache_salt. `by_clock`: the attacker times its probes (else it reads the counters, which are exact)."""
    rng = random.Random(seed * 1000 + clinic)
    form = Form(clinic)
    trial = Trial(tuple(rng.randrange(len(values)) for _, values in FIELDS))
    victim = Tenant(server, "victim-salt" if salted else None)
    attacker = Tenant(server, "attacker-salt" if salted else None)
    victim.probe(form.prompt(trial.secret))
    if by_clock:
        calibrate(attacker, form, trial, rng)
    recover(attacker, form, trial, by_clock)
    return trial


@dataclass(frozen=True)
class AttackSummary:
    """Several trials of one setting."""

    salted: bool  # each tenant its own cache_salt
    trials: list[Trial]

    @property
    def blocks(self) -> tuple[int, int]:
        """(fields recovered correctly, fields) over all trials."""
        return sum(t.correct for t in self.trials), sum(len(t.secret) for t in self.trials)

    @property
    def requests(self) -> float:
        return statistics.mean(t.requests for t in self.trials)

    def median_ms(self, kind: str) -> float:
        """The median calibration TTFT of every trial, "hit" or "miss", in milliseconds."""
        return 1e3 * statistics.median(x for t in self.trials for x in getattr(t, f"{kind}_ttfts"))

    def line(self) -> str:
        right, total = self.blocks
        k = len(FIELDS[0][1])
        return (
            f"{'salted  ' if self.salted else 'no salts'}: {right}/{total} fields recovered ({right / total:.0%}; "
            f"chance {1 / k:.0%}), {self.requests:.1f} requests per form (whole-form guessing: up to {k ** len(FIELDS)}"
            f"), TTFT median hit {self.median_ms('hit'):.1f} ms, miss {self.median_ms('miss'):.1f} ms"
        )


def attack(server: LessonServer, trials: int, salted: bool, first_clinic: int = 0, seed: int = 0) -> AttackSummary:
    """`trials` timed attacks on fresh secrets, each behind a system block of its own (a fresh cache)."""
    return AttackSummary(salted, [run_trial(server, first_clinic + n, salted, seed=seed) for n in range(trials)])

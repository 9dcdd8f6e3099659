"""Build the default cancer-detection model the platform ships, and its model card.

Usage: ``python scripts/build_cancer_model.py`` (needs the dev extras: scikit-learn,
skl2onnx). Writes ``platform_api/ai/data/cancer_cytology.onnx`` and
``platform_api/ai/data/cancer_cytology.card.json``.

Data: the Wisconsin Diagnostic Breast Cancer data set that scikit-learn ships
(``sklearn.datasets.load_breast_cancer``; 569 fine-needle aspirates, 30 features of the
cell nuclei; Street, Wolberg & Mangasarian 1993; UCI ML repository, CC BY 4.0).
Model: standard scaling then L2 logistic regression, fitted on a stratified 70 % split.
The decision threshold is chosen on the training split only (5-fold out-of-fold
probabilities): the highest threshold that keeps sensitivity for malignancy at or above
``TARGET_SENSITIVITY`` — a missed cancer costs more than a needless biopsy. Everything
reported in the card (AUC, sensitivity and specificity at that threshold, Brier score,
a reliability table) is measured on the 30 % held out, which the fit never saw.
Seeds are fixed, so the file is the same on every run with the same library versions.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import skl2onnx
import sklearn
from skl2onnx import to_onnx
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import brier_score_loss, roc_auc_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "platform_api" / "ai" / "data"
MODEL, CARD = DATA / "cancer_cytology.onnx", DATA / "cancer_cytology.card.json"
SEED = 20240501
TEST_SIZE = 0.30
TARGET_SENSITIVITY = 0.95
VERSION = "1.0.0"
LABELS = ["benign", "malignant"]


def feature_names() -> list[str]:
    """The data set's names as API field names: 'mean radius' → 'mean_radius'."""
    return [n.replace(" ", "_") for n in load_breast_cancer().feature_names]


def split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Train and held-out rows (x, y with 1 = malignant) and the held-out row indices
    into ``load_breast_cancer()`` (the tests use exactly these rows)."""
    data = load_breast_cancer()
    malignant = (data.target == 0).astype(int)  # sklearn codes malignant as 0
    index = np.arange(len(malignant))
    x_train, x_test, y_train, y_test, _, i_test = train_test_split(
        data.data, malignant, index, test_size=TEST_SIZE, stratify=malignant,
        random_state=SEED)
    return x_train, x_test, y_train, y_test, i_test


def pipeline() -> object:
    return make_pipeline(StandardScaler(),
                         LogisticRegression(C=1.0, max_iter=5000, random_state=SEED))


def threshold_for(y: np.ndarray, p: np.ndarray, sensitivity: float) -> float:
    """The highest threshold whose sensitivity on (y, p) is at least ``sensitivity``."""
    positives = np.sort(p[y == 1])
    allowed = int(np.floor((1 - sensitivity) * len(positives)))  # positives we may miss
    return round(float(positives[allowed]) - 1e-6, 4)


def reliability(y: np.ndarray, p: np.ndarray, bins: int = 5) -> list[dict[str, object]]:
    edges = np.linspace(0, 1, bins + 1)
    table = []
    for low, high in itertools.pairwise(edges):
        inside = (p >= low) & ((p < high) if high < 1 else (p <= high))
        if inside.any():
            table.append({"bin": f"{low:.1f}-{high:.1f}", "n": int(inside.sum()),
                          "mean_predicted": round(float(p[inside].mean()), 3),
                          "observed_malignant": round(float(y[inside].mean()), 3)})
    return table


def evaluate(y: np.ndarray, p: np.ndarray, threshold: float) -> dict[str, object]:
    flagged = p >= threshold
    tp, fn = int((flagged & (y == 1)).sum()), int((~flagged & (y == 1)).sum())
    tn, fp = int((~flagged & (y == 0)).sum()), int((flagged & (y == 0)).sum())
    return {"n": len(y), "malignant": int(y.sum()), "auc": round(float(
        roc_auc_score(y, p)), 4), "threshold": threshold,
        "sensitivity": round(tp / (tp + fn), 4), "specificity": round(tn / (tn + fp), 4),
        "confusion": {"true_positive": tp, "false_negative": fn, "true_negative": tn,
                      "false_positive": fp},
        "brier_score": round(float(brier_score_loss(y, p)), 4),
        "reliability": reliability(y, p)}


def first_output_probabilities(model: onnx.ModelProto) -> bytes:
    """skl2onnx lists the label first and the probabilities second; the platform reads the
    first output as the scores, so the probabilities go first."""
    outputs = list(model.graph.output)
    del model.graph.output[:]
    model.graph.output.extend([o for o in outputs if o.name == "probabilities"]
                              + [o for o in outputs if o.name != "probabilities"])
    onnx.checker.check_model(model)
    return model.SerializeToString()  # type: ignore[no-any-return]


def main() -> int:
    x_train, x_test, y_train, y_test, i_test = split()
    model = pipeline()
    folds = StratifiedKFold(n_splits=5, shuffle=True, random_state=SEED)
    out_of_fold = cross_val_predict(model, x_train, y_train, cv=folds,
                                    method="predict_proba")[:, 1]
    threshold = threshold_for(y_train, out_of_fold, TARGET_SENSITIVITY)
    model.fit(x_train, y_train)  # type: ignore[attr-defined]
    content = first_output_probabilities(to_onnx(
        model, x_train[:1].astype(np.float32), target_opset=15,
        options={"zipmap": False}))
    # the ONNX graph, not scikit-learn, is what answers: evaluate the file itself
    session = onnxruntime.InferenceSession(content, providers=["CPUExecutionProvider"])
    p_test = session.run(None, {session.get_inputs()[0].name:
                                x_test.astype(np.float32)})[0][:, 1].astype(np.float64)
    reference = model.predict_proba(x_test)[:, 1]  # type: ignore[attr-defined]
    card = {
        "name": "Breast cytology cancer risk (logistic regression)", "version": VERSION,
        "task": "cancer-detection", "labels": LABELS, "features": feature_names(),
        "input": "30 features of the cell nuclei of a breast fine-needle aspirate, as "
                 "computed from its digitised image (mean, standard error and worst of "
                 "radius, texture, perimeter, area, smoothness, compactness, concavity, "
                 "concave points, symmetry, fractal dimension), in the units of the data set",
        "output": "probabilities [benign, malignant]",
        "intended_use": "Decision support for triage of breast fine-needle aspirates "
                        "whose nuclear features were measured; not a diagnosis, not for "
                        "images or other tissues.",
        "data": {"name": "Breast Cancer Wisconsin (Diagnostic)", "rows": 569,
                 "source": "sklearn.datasets.load_breast_cancer (scikit-learn "
                           f"{sklearn.__version__}); UCI ML repository, "
                           "doi:10.24432/C5DW2B, CC BY 4.0",
                 "citation": "Street WN, Wolberg WH, Mangasarian OL. Nuclear feature "
                             "extraction for breast tumor diagnosis. IS&T/SPIE 1993 "
                             "International Symposium on Electronic Imaging, vol. 1905, "
                             "pp. 861-870.",
                 "split": {"method": "stratified train_test_split", "test_size": TEST_SIZE,
                           "random_state": SEED, "train_rows": len(y_train),
                           "held_out_rows": sorted(int(i) for i in i_test)}},
        "model": {"pipeline": "StandardScaler -> LogisticRegression(C=1.0, L2)",
                  "training": f"scikit-learn {sklearn.__version__}, skl2onnx "
                              f"{skl2onnx.__version__}, seed {SEED}",
                  "threshold_rule": f"highest threshold with sensitivity >= "
                                    f"{TARGET_SENSITIVITY} on 5-fold out-of-fold "
                                    "probabilities of the training split"},
        "threshold": threshold,
        "evaluation_held_out": evaluate(y_test, p_test, threshold),
        "onnx_matches_sklearn_max_abs_diff": float(np.abs(p_test - reference).max()),
        "limitations": [
            "One data set from one centre (University of Wisconsin, 1990s); performance "
            "elsewhere is unknown until checked on local cases.",
            "Features must be computed as in the data set (Xcyt); other image analysis "
            "software gives other values.",
            "Probabilities are calibrated on this data set only (see the reliability table)."],
        "licence": "Model: the platform's licence; data: CC BY 4.0",
        "sha256": hashlib.sha256(content).hexdigest(), "size": len(content),
    }
    MODEL.write_bytes(content)
    CARD.write_text(json.dumps(card, indent=1) + "\n")
    metrics = card["evaluation_held_out"]
    print(json.dumps({k: metrics[k] for k in ("auc", "threshold", "sensitivity",  # type: ignore[index]
                                                "specificity", "brier_score")}
                     | {"bytes": len(content)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

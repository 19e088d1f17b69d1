"""The taxonomy's two classifiers, fitted once and shipped as checked data (JSON, never pickle).

Fitting the category and domain models (:mod:`ucp.reliability.logs.classifier`)
takes about a second, and their input - the taxonomy's examples - changes only
when the taxonomy does. So the fitted numbers of the built-in taxonomy ship in
``ucp/reliability/data/classifier_{categories,domains}.json``, each with the
*digest* of what it was fitted from: the training texts and labels, the seed
and the fit's settings. :func:`fitted_model` computes the digest of the
taxonomy at hand; when the shipped file's digest is the same, the model is
read from the file, otherwise (a site taxonomy, an edited example) it is
fitted here, as before. A file that is damaged is refused loudly, never
half-read.

Arrays travel as ``{"dtype": "float64", "shape": [...], "sha256": ...,
"zlib_base64": ...}``: exact float64 bytes (the margins and probabilities of a
model read from the file are those of the fitted one, bit for bit), checked
against their shape and hash before use.

Example::

    model = fitted_model(load_taxonomy(), "categories")  # read from the shipped file
    model.classify(mask("GPU 3 encountered a fatal error"))

    python -m ucp.reliability.logs.fitted --write   # after editing data/taxonomy.json
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import sys
import zlib
from importlib import resources
from pathlib import Path

import numpy as np

from ucp.reliability.logs.classifier import (FEATURE_PARAMS, SVM_C, TemplateClassifier, category_examples,
                                             domain_examples)
from ucp.reliability.logs.errors import FittedModelError
from ucp.reliability.logs.taxonomy import Taxonomy, load_taxonomy

FORMAT = "ucp-fitted-classifier"
VERSION = 1
# Bump when the fit changes in a way FEATURE_PARAMS and SVM_C do not show (folds, calibration, masking).
RECIPE = 1
KINDS = ("categories", "domains")
_ARRAYS = ("coef", "intercept", "a", "b")


def training_data(taxonomy: Taxonomy, kind: str) -> tuple[list[str], list[str], float]:
    """``(texts, labels, threshold)`` that the ``kind`` model of ``taxonomy`` is fitted from and used with."""
    if kind == "categories":
        return (*category_examples(taxonomy), taxonomy.confidence_threshold)
    if kind == "domains":
        return (*domain_examples(taxonomy), 0.0)
    raise ValueError(f"unknown classifier kind {kind!r}; expected one of {KINDS}")


def training_digest(texts: list[str], labels: list[str], *, seed: int = 0) -> str:
    """SHA-256 of everything a fit depends on: the data, the seed and the fit's settings.

    >>> training_digest(["a b"], ["x"]) == training_digest(["a b"], ["x"]), \\
    ...     training_digest(["a b"], ["x"]) == training_digest(["a c"], ["x"])
    (True, False)
    """
    recipe = {"recipe": RECIPE, "features": [[name, params] for name, params in FEATURE_PARAMS],
              "svm_c": SVM_C, "seed": seed, "texts": list(texts), "labels": list(labels)}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True, ensure_ascii=True).encode("ascii")).hexdigest()


def shipped_path(kind: str) -> str:
    """Where the built-in taxonomy's ``kind`` model ships, relative to the ``ucp.reliability`` package."""
    return f"data/classifier_{kind}.json"


def fitted_model(taxonomy: Taxonomy, kind: str, *, seed: int = 0) -> TemplateClassifier:
    """The ``kind`` model of ``taxonomy``: read from the shipped file when its digest matches, else fitted."""
    texts, labels, threshold = training_data(taxonomy, kind)
    digest = training_digest(texts, labels, seed=seed)
    resource = resources.files("ucp.reliability").joinpath(shipped_path(kind))
    if resource.is_file():
        origin = f"ucp/reliability/{shipped_path(kind)}"
        data = _parse(resource.read_text("utf-8"), origin)
        if data.get("digest") == digest:
            return from_dict(data, threshold=threshold, origin=origin)
    return TemplateClassifier.fit(texts, labels, threshold=threshold, seed=seed)


def to_dict(model: TemplateClassifier, *, digest: str) -> dict:
    """The JSON form of a fitted model (see the module docstring); ``digest`` names its training data."""
    blocks = []
    for (name, _), vocab, idf in zip(FEATURE_PARAMS, model.vocabularies, model.idfs):
        terms = sorted(vocab, key=vocab.__getitem__)
        blocks.append({"name": name, "terms": terms, "idf": _encode(idf)})
    import sklearn

    return {"format": FORMAT, "version": VERSION, "digest": digest, "sklearn": sklearn.__version__,
            "classes": list(model.classes), "blocks": blocks,
            **{name: _encode(array) for name, array in model.arrays().items()}}


def from_dict(data: dict, *, threshold: float, origin: str = "fitted classifier") -> TemplateClassifier:
    """A model from its JSON form; every field is checked first (:class:`FittedModelError` names what is wrong)."""
    def fail(what: str) -> FittedModelError:
        return FittedModelError(f"{origin}: {what}; refit it with `python -m ucp.reliability.logs.fitted --write` "
                                f"(or delete it: the model is then fitted at run time)")

    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise fail(f"not a {FORMAT} file of version {VERSION}")
    classes = data.get("classes")
    if not isinstance(classes, list) or len(classes) < 2 or not all(isinstance(c, str) for c in classes) \
            or len(set(classes)) != len(classes):
        raise fail("'classes' must be a list of two or more distinct names")
    blocks = data.get("blocks")
    if not isinstance(blocks, list) or [b.get("name") if isinstance(b, dict) else None for b in blocks] != \
            [name for name, _ in FEATURE_PARAMS]:
        raise fail(f"'blocks' must be the feature blocks {[name for name, _ in FEATURE_PARAMS]}, in that order")
    vocabularies, idfs = [], []
    for block in blocks:
        terms = block.get("terms")
        if not isinstance(terms, list) or not all(isinstance(t, str) for t in terms) or len(set(terms)) != len(terms):
            raise fail(f"block {block['name']!r}: 'terms' must be a list of distinct strings")
        idf = _decode(block.get("idf"), (len(terms),), f"block {block['name']!r} idf", fail)
        vocabularies.append({term: i for i, term in enumerate(terms)})
        idfs.append(idf)
    width = sum(len(v) for v in vocabularies)
    shapes = {"coef": (width, len(classes)), "intercept": (len(classes),), "a": (len(classes),),
              "b": (len(classes),)}
    arrays = {name: _decode(data.get(name), shapes[name], repr(name), fail) for name in _ARRAYS}
    return TemplateClassifier(vocabularies=vocabularies, idfs=idfs, classes=classes, threshold=threshold, **arrays)


def _encode(array) -> dict:
    raw = np.ascontiguousarray(array, dtype="<f8")
    data = raw.tobytes()
    return {"dtype": "float64", "shape": list(raw.shape), "sha256": hashlib.sha256(data).hexdigest(),
            "zlib_base64": base64.b64encode(zlib.compress(data, 9)).decode("ascii")}


def _decode(field, shape: tuple, what: str, fail) -> np.ndarray:
    if not isinstance(field, dict) or field.get("dtype") != "float64" or not isinstance(field.get("zlib_base64"), str):
        raise fail(f"{what} must be {{'dtype': 'float64', 'shape': ..., 'sha256': ..., 'zlib_base64': ...}}")
    if field.get("shape") != list(shape):
        raise fail(f"{what} has shape {field.get('shape')}, expected {list(shape)}")
    size = 8 * int(np.prod(shape))
    try:
        packed = base64.b64decode(field["zlib_base64"], validate=True)
        inflater = zlib.decompressobj()
        raw = inflater.decompress(packed, size + 1)  # a bound: a damaged stream cannot inflate without end
    except (binascii.Error, zlib.error):  # their wording differs between Python versions: not repeated
        raise fail(f"{what} is not zlib data in base64") from None
    if len(raw) != size or not inflater.eof:
        raise fail(f"{what} holds {len(raw)} bytes, expected {size} for shape {list(shape)}")
    if hashlib.sha256(raw).hexdigest() != field.get("sha256"):
        raise fail(f"{what} does not match its sha256")
    array = np.frombuffer(raw, dtype="<f8").reshape(shape)
    if not np.isfinite(array).all():
        raise fail(f"{what} holds values that are not finite")
    return array


def _parse(text: str, origin: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise FittedModelError(f"{origin}: not valid JSON ({err}); refit it with "
                               f"`python -m ucp.reliability.logs.fitted --write`") from None


def write_shipped(directory: str | None = None, *, taxonomy: Taxonomy | None = None) -> list[str]:
    """Fit the built-in taxonomy's models and write them where :func:`fitted_model` looks (or to ``directory``)."""
    taxonomy = taxonomy or load_taxonomy()
    base = Path(directory) if directory else Path(str(resources.files("ucp.reliability")))
    written = []
    for kind in KINDS:
        texts, labels, threshold = training_data(taxonomy, kind)
        model = TemplateClassifier.fit(texts, labels, threshold=threshold)
        path = base / shipped_path(kind) if directory is None else base / Path(shipped_path(kind)).name
        path.write_text(json.dumps(to_dict(model, digest=training_digest(texts, labels)), indent=0) + "\n",
                        encoding="utf-8")
        written.append(str(path))
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Fit the built-in taxonomy's classifiers and ship their numbers.")
    ap.add_argument("--write", action="store_true", help="refit both models and rewrite the shipped files")
    args = ap.parse_args(argv)
    taxonomy = load_taxonomy()
    if args.write:
        for path in write_shipped(taxonomy=taxonomy):
            print(f"wrote {path}")
    stale = []
    for kind in KINDS:
        texts, labels, _ = training_data(taxonomy, kind)
        resource = resources.files("ucp.reliability").joinpath(shipped_path(kind))
        current = resource.is_file() and _parse(resource.read_text("utf-8"), shipped_path(kind)).get("digest") \
            == training_digest(texts, labels)
        print(f"{shipped_path(kind)}: {'current' if current else 'stale (fitted at run time)'}")
        stale += [] if current else [kind]
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

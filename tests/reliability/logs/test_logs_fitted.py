"""The taxonomy's classifiers shipped as fitted numbers: current, exact, refit when stale, refused when damaged."""

import base64
import copy
import json
import zlib
from importlib import resources

import numpy as np
import pytest

from ucp.reliability.logs.classifier import TemplateClassifier
from ucp.reliability.logs.errors import FittedModelError
from ucp.reliability.logs.fitted import (KINDS, fitted_model, from_dict, main, shipped_path, to_dict,
                                         training_data, training_digest, write_shipped)
from ucp.reliability.logs.masking import mask
from ucp.reliability.logs.taxonomy import load_taxonomy

FIX = "refit it with `python -m ucp.reliability.logs.fitted --write` (or delete it: the model is then fitted at run time)"


@pytest.fixture(scope="module")
def taxonomy():
    return load_taxonomy()


@pytest.fixture(scope="module")
def shipped():
    return json.loads(resources.files("ucp.reliability").joinpath(shipped_path("domains")).read_text("utf-8"))


@pytest.mark.parametrize("kind", KINDS)
def test_shipped_models_are_fitted_from_the_builtin_taxonomy(taxonomy, kind):
    # Editing data/taxonomy.json without `python -m ucp.reliability.logs.fitted --write` fails here.
    texts, labels, _ = training_data(taxonomy, kind)
    data = json.loads(resources.files("ucp.reliability").joinpath(shipped_path(kind)).read_text("utf-8"))
    assert data["digest"] == training_digest(texts, labels)
    assert main([]) == 0


def test_shipped_model_gives_the_fitted_models_probabilities_exactly(taxonomy):
    read = fitted_model(taxonomy, "categories")
    fitted = TemplateClassifier.train(taxonomy)
    assert read.classes == fitted.classes and read.threshold == fitted.threshold
    probes = [mask(text) for text, _ in taxonomy.labeled_examples()][::9] + [mask("GPU 3 encountered a fatal error")]
    # The arrays are stored as exact float64 bytes, but a refit on another machine's BLAS moves the Platt
    # sigmoids' last bits (3e-14 here): the probabilities agree to 1e-12, far below what a float32 or
    # decimal round trip would lose (1e-8).
    for text in probes:
        np.testing.assert_allclose(read.probabilities(text), fitted.probabilities(text), rtol=0, atol=1e-12,
                                   err_msg=text)


def test_a_changed_taxonomy_is_fitted_not_read(tmp_path):
    site = tmp_path / "site.json"
    site.write_text(json.dumps({"categories": {"infra/site/rack-power": {
        "patterns": ["rack power lost"], "domain": "infra",
        "examples": ["rack power lost on pdu 3", "rack power lost on pdu 7 feed B"]}}}))
    taxonomy = load_taxonomy(extra=str(site))
    model = fitted_model(taxonomy, "categories")  # the shipped file does not know this category
    assert "infra/site/rack-power" in model.classes
    assert model.classify(mask("rack power lost on pdu 9")).category == "infra/site/rack-power"


def test_round_trip_of_a_small_model(tmp_path):
    texts = ["disk failed on sda", "disk failure on sdb", "disk sdc failed hard",
             "session opened for user", "session closed for user", "session opened for root"]
    labels = ["hardware/disk"] * 3 + ["normal"] * 3
    model = TemplateClassifier.fit(texts, labels, threshold=0.5)
    data = json.loads(json.dumps(to_dict(model, digest=training_digest(texts, labels))))
    again = from_dict(data, threshold=0.5)
    for text in ("disk failed on sdd", "session opened for bob", "zz"):
        assert np.array_equal(again.probabilities(mask(text)), model.probabilities(mask(text)))


def test_write_shipped_writes_both_models(tmp_path, taxonomy):
    paths = write_shipped(str(tmp_path), taxonomy=taxonomy)
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["classifier_categories.json", "classifier_domains.json"]
    data = json.loads((tmp_path / "classifier_domains.json").read_text())
    assert data["digest"] == training_digest(*training_data(taxonomy, "domains")[:2])


def _damage(data, how):
    data = copy.deepcopy(data)
    how(data)
    return data


def _repack(field, raw: bytes):
    field["zlib_base64"] = base64.b64encode(zlib.compress(raw)).decode()


@pytest.mark.parametrize("how, message", [
    (lambda d: d.update(format="pickle"), "not a ucp-fitted-classifier file of version 1"),
    (lambda d: d.update(classes=["hardware", "hardware"]), "'classes' must be a list of two or more distinct names"),
    (lambda d: d["blocks"].reverse(), "'blocks' must be the feature blocks ['chars', 'words'], in that order"),
    (lambda d: d["blocks"][1]["terms"].append(3), "block 'words': 'terms' must be a list of distinct strings"),
    (lambda d: d["blocks"][0]["terms"].pop(), "block 'chars' idf has shape [11064], expected [11063]"),
    (lambda d: d["a"].update(dtype="float32"),
     "'a' must be {'dtype': 'float64', 'shape': ..., 'sha256': ..., 'zlib_base64': ...}"),
    (lambda d: d["b"].update(zlib_base64="not base64!"), "'b' is not zlib data in base64"),
    (lambda d: d["b"].update(zlib_base64=base64.b64encode(b"not zlib").decode()), "'b' is not zlib data in base64"),
    (lambda d: _repack(d["b"], b"\0" * 24), "'b' holds 24 bytes, expected 32 for shape [4]"),
    (lambda d: _repack(d["b"], b"\0" * 32), "'b' does not match its sha256"),
])
def test_damaged_files_are_refused_with_what_is_wrong(shipped, how, message):
    with pytest.raises(FittedModelError) as err:
        from_dict(_damage(shipped, how), threshold=0.0, origin="classifier_domains.json")
    assert str(err.value) == f"classifier_domains.json: {message}; {FIX}"


def test_values_that_are_not_finite_are_refused(shipped):
    nan = np.full(4, np.nan).tobytes()

    def poison(d):
        _repack(d["b"], nan)
        d["b"]["sha256"] = __import__("hashlib").sha256(nan).hexdigest()

    with pytest.raises(FittedModelError, match=r"^x: 'b' holds values that are not finite; refit it"):
        from_dict(_damage(shipped, poison), threshold=0.0, origin="x")

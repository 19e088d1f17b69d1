"""Taxonomy rules, user taxonomies, the fallback classifier and the persisted template state."""

from __future__ import annotations

import base64
import json
import zlib

import numpy as np
import pytest

from ucp.reliability.logs.classifier import TemplateClassifier
from ucp.reliability.logs.errors import TaxonomyError, TemplateStateError
from ucp.reliability.logs.header import split_header
from ucp.reliability.logs.masking import mask, template_tokens
from ucp.reliability.logs.miner import TemplateMiner
from ucp.reliability.logs.taxonomy import load_taxonomy
from ucp.reliability.logs.template_state import TemplateSet


@pytest.fixture(scope="module")
def taxonomy():
    return load_taxonomy()


@pytest.mark.parametrize("message, category", [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.", "hardware/gpu/xid-79"),
    ("NVRM: Xid (PCI:0000:1a:00): 48, pid=9, An uncorrectable double bit error (DBE) has been detected on GPU.", "hardware/gpu/xid-48"),
    ("NVRM: Xid (PCI:0000:41:00): 63, pid=1, Row Remapper: New row marked for remapping", "hardware/gpu/row-remap"),
    ("NVRM: Xid (PCI:0000:5e:00): 74, pid=3, NVLink: fatal error detected on link 6", "hardware/network/nvlink"),
    ("NVRM: Xid (PCI:0000:5e:00): 13, pid=3, Graphics SM Warp Exception", "user/cuda/xid-app-fault"),
    ("NVRM: Xid (PCI:0000:5e:00): 119, pid=3, Timeout waiting for RPC from GSP", "hardware/gpu/xid-other"),
    ("mlx5_core 0000:0c:00.0 ib2: Link down", "hardware/network/ib-link"),
    ("pcieport 0000:00:03.1: AER: Multiple Uncorrected (Fatal) error received: 0000:3b:00.0", "hardware/pcie/aer"),
    ("mce: [Hardware Error]: CPU 12: Machine Check: 0 Bank 7: cc00008000010090", "hardware/cpu/mce"),
    ("CPU17: Package temperature above threshold, cpu clock throttled (total events = 31)", "hardware/thermal"),
    ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, "
     "Timeout(ms)=600000) ran for 600123 milliseconds before timing out.", "software/nccl/timeout"),
    ("gpu-1:1:2 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<5> with status=12", "software/nccl/remote-error"),
    ("RuntimeError: [pair.cc:598] Connection reset by peer [10.0.0.4]:4242 (gloo)", "software/nccl/connection-reset"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "user/oom/cuda-oom"),
    ("Out of memory: Killed process 8812 (python) total-vm:1kB", "user/oom/host-oom"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "software/cuda/illegal-memory-access"),
    ("step 4200: loss is NaN", "user/training/nan-loss"),
    ("_job_complete: JobId=81122 PREEMPTED", "infra/preemption"),
    ("job_complete: JobId=5521 NODE_FAIL", "infra/slurm/node-fail"),
    ("Time limit exhausted for JobId=3212", "infra/slurm/timeout"),
    ("_job_complete: JobId=6001 WTERMSIG 9", "infra/slurm/job-killed"),
    ("LustreError: 11-0: scratch-OST0004-osc: operation ost_write failed: rc = -107", "infra/filesystem/lustre"),
    ("nfs: server nas02 not responding, still trying", "infra/filesystem/nfs"),
    ("blk_update_request: I/O error, dev nvme1n1, sector 1835008", "infra/filesystem/io-error"),
    ("BackOff: Back-off restarting failed container trainer in pod w-3 (Pod)", "infra/kubernetes/pod-failure"),
    ("gpu-1:1:2 [0] NCCL INFO Connected all rings", "normal"),
    ("_job_complete: JobId=6001 WEXITSTATUS 0", None),
])
def test_rules_give_exact_categories(taxonomy, message, category):
    assert taxonomy.match_rule(message) == category


def test_masked_lines_keep_decisive_numbers():
    assert mask("NVRM: Xid (PCI:0000:3b:00): 79, pid=1") != mask("NVRM: Xid (PCI:0000:3b:00): 48, pid=1")
    assert mask("gpu-a01 pid=17") == mask("gpu-b99 pid=123456")


def test_classifier_abstains_on_gibberish_and_keeps_normal_lines_normal(taxonomy):
    model = TemplateClassifier.train(taxonomy)
    assert not model.classify(mask("zqxj vvkw plorb 77")).is_failure
    probs = model.probabilities(mask("GPU 3 encountered a fatal error"))
    assert abs(probs.sum() - 1.0) < 1e-9
    strict = model.with_threshold(0.999)
    verdict = strict.classify(mask("GPU 3 encountered a fatal error"))
    assert (verdict.category, verdict.method) == ("unclassified", "threshold")
    normal = model.classify(mask("systemd[1]: Started Session 12 of user carol."))
    assert normal.category in ("normal", "unclassified")
    assert not normal.is_failure


def test_classifier_is_sklearns_calibrated_svm(taxonomy):
    # Our Platt sigmoids (all classes' Newton steps at once) and hand-rolled margins give what sklearn's
    # CalibratedClassifierCV(sigmoid, ensemble=False) over the same LinearSVC and folds gives.
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.svm import LinearSVC

    model = TemplateClassifier.train(taxonomy)
    texts = [mask(text) for text, _ in taxonomy.labeled_examples()]
    labels = [label for _, label in taxonomy.labeled_examples()]
    x = model._features.transform(texts)
    reference = CalibratedClassifierCV(LinearSVC(C=1.0, random_state=0), cv=3, method="sigmoid",
                                       ensemble=False).fit(x, labels)
    assert list(reference.classes_) == model.classes
    probe = texts[::7] + [mask("GPU 3 encountered a fatal error"), mask("zqxj vvkw plorb 77")]
    ours = np.array([model.probabilities(text) for text in probe])
    assert abs(ours - reference.predict_proba(model._features.transform(probe))).max() < 1e-5
    # all at once (one sparse product) as one at a time; a message with no known n-gram among them
    batch = model.probabilities_many(probe + ["<*>"])
    assert abs(batch[:-1] - ours).max() < 1e-12
    assert abs(batch[-1] - model.probabilities("<*>")).max() < 1e-12
    assert [c.category for c in model.classify_many(probe)] == [model.classify(t).category for t in probe]


def test_classifier_with_two_classes_gives_both_probabilities():
    texts = ["disk failed on sda", "disk failure on sdb", "disk sdc failed hard",
             "session opened for user", "session closed for user", "session opened for root"]
    model = TemplateClassifier.fit(texts, ["hardware/disk"] * 3 + ["normal"] * 3, threshold=0.5)
    probs = model.probabilities(mask("disk failed on sdd"))
    assert model.classes == ["hardware/disk", "normal"] and abs(probs.sum() - 1.0) < 1e-9
    assert probs[0] > 0.5 and model.probabilities(mask("session opened for bob"))[1] > 0.5


def test_user_taxonomy_overrides_and_extends(tmp_path):
    user = tmp_path / "site.json"
    user.write_text(json.dumps({"categories": {
        "hardware/gpu/xid-79": {"patterns": ["GPU went dark"], "examples": ["GPU went dark on slot 3"]},
        "infra/scheduler/maintenance": {"patterns": ["drained for maintenance"],
                                        "examples": ["node a drained for maintenance", "x drained for maintenance",
                                                     "drained for maintenance window"]},
    }, "settings": {"confidence_threshold": 0.9}}))
    tax = load_taxonomy(extra=str(user))
    assert tax.match_rule("GPU went dark on slot 3") == "hardware/gpu/xid-79"
    assert tax.match_rule("gpu-4 drained for maintenance") == "infra/scheduler/maintenance"
    assert tax.match_rule("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.") == "hardware/gpu/xid-79"
    assert tax.confidence_threshold == 0.9


@pytest.mark.parametrize("content, message", [
    ("{not json", r"site.json:1:2: not valid JSON: Expecting property name enclosed in double quotes"),
    ('{"cats": {}}', r'site.json: expected an object with a "categories" object \(see docs/LOGS.md\)'),
    ('{"categories": {"Hardware GPU": {}}}', r"site.json: category 'Hardware GPU': expected domain/category/subcategory"),
    ('{"categories": {"a/b": {"patterns": ["("]}}}', r"site.json: category 'a/b': bad pattern '\(': missing \), unterminated subpattern"),
    ('{"categories": {}, "settings": {"confidence_threshold": 2}}', r"settings.confidence_threshold must be a number in \[0, 1\], got 2"),
    ('{"categories": {"a/b": {"fatal": "false"}}}', r"site.json: category 'a/b': 'fatal' must be true or false, got 'false'"),
    ('{"categories": {"a/b": {"symptom": 1}}}', r"site.json: category 'a/b': 'symptom' must be true or false, got 1"),
    ('{"categories": {}, "settings": {"root_cause_order": "hardware"}}', r"settings.root_cause_order must be a list of category prefixes, got 'hardware'"),
])
def test_bad_taxonomy_files_say_what_is_wrong(tmp_path, content, message):
    user = tmp_path / "site.json"
    user.write_text(content)
    with pytest.raises(TaxonomyError, match=message):
        load_taxonomy(extra=str(user))


def _tokens(message: str) -> tuple[str, ...]:
    return template_tokens(split_header(message)[1])


def test_template_ids_survive_across_runs(tmp_path):
    state = str(tmp_path / "templates.json")
    run1 = ["NVRM: Xid (PCI:0000:3b:00): 79, pid=11, GPU has fallen off the bus.",
            "error: Nodes gpu-a01 not responding, setting DOWN",
            "sshd[7]: Accepted publickey for alice from 10.0.0.5 port 22 ssh2"]
    known = TemplateSet.load(state)  # no file yet: an empty set
    ids1 = TemplateMiner(known=known).fit({_tokens(m): 1 for m in run1})
    known.save(state)
    assert len(set(ids1.values())) == 3

    again = TemplateSet.load(state)
    assert len(again) == 3
    # Same kinds of lines with other numbers/hosts, then a new kind.
    run2 = ["NVRM: Xid (PCI:0000:86:00): 79, pid=99, GPU has fallen off the bus.",
            "error: Nodes gpu-z77 not responding, setting DOWN",
            "LustreError: 11-0: scratch-OST0004: operation ost_write failed: rc = -107"]
    ids2 = TemplateMiner(known=again).fit({_tokens(m): 1 for m in run2})
    assert [ids2[_tokens(m)] for m in run2[:2]] == [ids1[_tokens(run1[0])], ids1[_tokens(run1[1])]]
    assert ids2[_tokens(run2[2])] == 4  # a new template gets the next id
    again.save(state)
    data = json.loads((tmp_path / "templates.json").read_text())
    assert data["format"] == "ucp-log-templates" and data["version"] == 1 and data["next_id"] == 5
    assert [t["count"] for t in data["templates"]] == [2, 2, 1, 1]


def test_corrupt_state_is_a_clear_error(tmp_path):
    state = tmp_path / "bad.json"
    state.write_bytes(b"this is not a template state")
    with pytest.raises(TemplateStateError, match=r"template state .*bad.json.* is not valid JSON .*"
                                                 r"delete it to start afresh"):
        TemplateSet.load(str(state))
    state.write_bytes(b"\x1f\x8b\x08\x00binary")
    with pytest.raises(TemplateStateError, match=r"is not UTF-8 JSON \(binary data at byte 1\)"):
        TemplateSet.load(str(state))
    state.write_text('{"format": "ucp-log-templates", "version": 1, "templates": [{"id": 0, "template": "x"}]}')
    with pytest.raises(TemplateStateError, match=r"templates\[0\].id must be a unique positive integer, got 0"):
        TemplateSet.load(str(state))


def test_a_jsonpickle_state_never_runs_code(tmp_path):
    # drain3 restored --state files with jsonpickle: this payload ran `touch` on load (issue 8, item 8).
    marker = tmp_path / "pwned"
    payload = {"py/reduce": [{"py/function": "os.system"}, {"py/tuple": [f"touch {marker}"]}]}
    state = tmp_path / "evil.json"
    state.write_text(json.dumps({"id_to_cluster": payload}))
    with pytest.raises(TemplateStateError, match=r"is a jsonpickle document \(e.g. a drain3 state\): it can run "
                                                 r"code when loaded, so it is never loaded"):
        TemplateSet.load(str(state))
    state.write_text(json.dumps(payload))
    with pytest.raises(TemplateStateError, match="jsonpickle"):
        TemplateSet.load(str(state))
    # drain3's own state format (zlib + base64 of jsonpickle): the old loader ran os.system here.
    state.write_bytes(base64.b64encode(zlib.compress(json.dumps(payload).encode())))
    with pytest.raises(TemplateStateError, match=r"is not valid JSON .*delete it to start afresh"):
        TemplateSet.load(str(state))
    assert not marker.exists()

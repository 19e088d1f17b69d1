"""Severity headers, failure evidence, the miner, mined categories, and the HPC failure families."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucp.reliability.logs.analyze import AnalysisOptions, analyze_logs
from ucp.reliability.logs.detect import (Detector, LineEvidence, TemplateStats, failure_phrase, feature_vector, is_dump,
                                        line_evidence)
from ucp.reliability.logs.discover import FlaggedTemplate, discover_categories
from ucp.reliability.logs.header import CRITICAL, ERROR, INFO, WARNING, split_header
from ucp.reliability.logs.masking import template_tokens
from ucp.reliability.logs.miner import TemplateMiner, group_sequences
from ucp.reliability.logs.taxonomy import load_taxonomy
from ucp.reliability.logs.template_state import TemplateSet


@pytest.mark.parametrize("message, severity, content", [
    ("RAS KERNEL FATAL torus sender failure on link x+", CRITICAL, "torus sender failure on link x+"),
    ("RAS APP SEVERE ciod: cannot start job 12", ERROR, "cannot start job 12"),
    ("17/06/09 20:10:40 INFO executor.Backend: Registered signal handlers", INFO, "Registered signal handlers"),
    ("2015-07-29 17:41:44,747 - WARN  [QuorumPeer:Leader@77] - Notification time out: 3200", WARNING,
     "Notification time out: 3200"),
    ("03-17 16:13:38.811  1702  2395 E ActivityManager: ANR in com.example", ERROR, "ANR in com.example"),
    ("[error] mod_jk child workerEnv in error state 6", ERROR, "mod_jk child workerEnv in error state 6"),
    ("<3>nvme nvme0: I/O 12 QID 3 timeout, aborting", ERROR, "nvme nvme0: I/O 12 QID 3 timeout, aborting"),
    ("E0601 12:00:00.123456 1234 kubelet.go:12] pod sync failed", ERROR, "pod sync failed"),
    ("slurmd[42]: error: Nodes gpu-3 not responding", ERROR, "Nodes gpu-3 not responding"),
    ("level=error msg=\"driver crashed\"", ERROR, "msg=\"driver crashed\""),
    ("Warning BackOff: Back-off restarting failed container (Pod)", WARNING,
     "Back-off restarting failed container (Pod)"),
    ("sshd[7]: Failed password for root from 10.0.0.1", None, "Failed password for root from 10.0.0.1"),
    ("an error in a sentence is not a level", None, "an error in a sentence is not a level"),
])
def test_headers_give_severity_and_content(message, severity, content):
    assert split_header(message) == (severity, content)


@pytest.mark.parametrize("text, severity, failure", [
    ("torus receiver error on link 3: packet dropped", CRITICAL, True),
    ("12 ddr errors detected and corrected", INFO, False),  # the failure is taken back
    ("authentication failure for user root", None, False),  # a security event, not a system failure
    ("general purpose registers:", CRITICAL, False),  # a dump header: data, not a report
    ("instruction address: 0x0012a4", CRITICAL, False),
    ("Lustre mount FAILED : ionode7 : block_id : location", CRITICAL, True),
    ("job 12 started on 64 nodes", INFO, False),
    # a strong phrase without any other failure word, no level: it counted only as "strong" before, which
    # the fit weighs against routine boot lines naming a machine check, and p stayed under 0.5
    ("GPU 3 has fallen off the bus", None, True),
])
def test_detector_judges_text_it_was_never_shown(text, severity, failure):
    evidence = line_evidence(" ".join(template_tokens(text)), severity=severity)
    stats = TemplateStats(lines=3, nodes=2, total_lines=100_000, total_nodes=512)
    p = Detector.load().probability(evidence, stats)
    assert (p >= Detector.load().threshold) == failure, (text, p, evidence)


@pytest.mark.parametrize("content, words", [
    ("ERROR_FILE_NOT_FOUND while opening the package", 1),  # failure words inside an identifier count
    ("io_error on dev sdb", 1),
    ("getFileName returned", 0),  # camel case: words start at capitals, and none of these is a failure word
    ("sendSyncFailedBroadcast", 1),
    ("DNSError handled", 0),  # a run of capitals is one word: "DNSError" is not "DNS Error"
    ("[HRESULT = 0x800f080d - CBS_E_MANIFEST_INVALID_ITEM]", 3),  # INVALID, the failure bit, an E_ constant
    ("[HRESULT = 0x00000000 - S_OK]", 0),
    ("open of /scratch/x returned ENOSPC", 1),
    ("ldlm_cli_cancel_req rc = -107", 1),
    ('10.0.0.1 "GET /v2/servers HTTP/1.1" status: 503 len: 12', 1),  # a server error
    ('10.0.0.1 "GET /v2/servers HTTP/1.1" status: 404 len: 12', 0),  # the client's, not the server's
    ('10.0.0.1 - - "POST /api HTTP/1.1" 500 231', 1),
    ('10.0.0.1 - - "POST /api HTTP/1.1" 200 231', 0),
])
def test_failure_words_in_identifiers_and_error_codes(content, words):
    assert line_evidence(" ".join(template_tokens(content)), severity=INFO, raw=content).failure_words == words


def test_dump_lines_and_failure_phrases():
    assert is_dump("r<*>=<*> r<*>=<*> r<*>=<*>") and is_dump("Call Trace:")
    assert not is_dump("data TLB error interrupt")
    assert failure_phrase("<*> ciod: Error reading message prefix on socket <*>") == \
        "<*> ciod: Error reading message prefix".split(" ", 1)[1]
    assert failure_phrase("job finished") is None


@settings(max_examples=40, deadline=None)
@given(st.permutations(range(12)), st.integers(1, 5))
def test_mining_does_not_depend_on_the_order_lines_arrive_in(order, scale):
    users = ["alice", "bob", "carol", "dave", "erin"]
    seqs = [("session", "opened", "for", "user", u) for u in users] + \
        [("VM", state, "(Lifecycle", "Event)") for state in ("Started", "Stopped")] + \
        [("Invalid", "user", u, "from", "<*>") for u in users]
    counts = {seqs[i]: (i % 3 + 1) * scale for i in order}
    grouped = group_sequences(counts)
    assert len({grouped[s] for s in seqs[:5]}) == 1 and grouped[seqs[0]] == ("session", "opened", "for", "user", "<*>")
    assert grouped[seqs[5]] != grouped[seqs[6]]  # two values only: kept apart
    assert grouped == group_sequences(dict(sorted(counts.items())))


def test_new_template_ids_follow_first_occurrence_and_known_ids_stay():
    known = TemplateSet()
    first = TemplateMiner(known=known).fit({("disk", "<*>", "failed"): 2, ("fan", "ok"): 1})
    assert sorted(first.values()) == [1, 2] and first[("disk", "<*>", "failed")] == 1
    second = TemplateMiner(known=known).fit({("power", "lost"): 1, ("disk", "<*>", "failed"): 5})
    assert second == {("power", "lost"): 3, ("disk", "<*>", "failed"): 1}
    assert known.get(1).count == 7


def test_mined_categories_cluster_similar_templates_and_name_them():
    flagged = [FlaggedTemplate(1, "ciod: Error reading message prefix on socket <*>", 40, ("a", "b"), ("x1",)),
               FlaggedTemplate(2, "ciod: Error reading message prefix after LOAD on socket <*>", 7, ("c",), ("x2",)),
               FlaggedTemplate(3, "frobnicator quux failed on shelf <*>", 5, ("d",), ("x3",))]
    random.Random(0).shuffle(flagged)
    found = discover_categories(flagged, domain_of=lambda text: ("infra", 0.7), taken=["infra/discovered/x"])
    assert [(c.path, c.template_ids, c.lines) for c in found] == [
        ("infra/discovered/ciod-error-reading-message-prefix", (1, 2), 47),
        ("infra/discovered/frobnicator-quux-failed-shelf", (3,), 5)]
    assert found[0].nodes == ("a", "b", "c") and found[0].examples == ("x1", "x2")
    entry = found[0].taxonomy_entry()
    assert entry["templates"] == [flagged_t.text for flagged_t in sorted(flagged, key=lambda t: -t.lines)[:2]]


# Lines written for this test (not the taxonomy's examples), one per HPC failure family.
@pytest.mark.parametrize("message, category", [
    ("RAS KERNEL FATAL instruction TLB error interrupt", "hardware/cpu/exception"),
    ("RAS KERNEL FATAL data storage interrupt", "hardware/cpu/exception"),
    ("RAS KERNEL FATAL machine check interrupt", "hardware/cpu/mce"),
    ("L2 cache parity error on core 3, uncorrectable", "hardware/memory/uncorrectable"),
    ("EDAC MC0: 1 UE multi-bit ECC error on DIMM_A2", "hardware/memory/ecc"),
    ("kernel panic - not syncing: Attempted to kill init!", "software/kernel/panic"),
    ("rts: kernel terminated for reason 7", "software/kernel/terminated"),
    ("tree receiver 1 error: link failure, packets lost", "hardware/network/torus-tree"),
    ("NETDEV WATCHDOG: eth3 (ixgbe): transmit queue 2 timed out", "hardware/network/ethernet"),
    ("kernel: [KERNEL_IB] mthca0: local catastrophic error", "hardware/network/infiniband"),
    ("NFS mount failed on /projects, giving up", "infra/filesystem/mount"),
    ("mmfsd: Node 10.0.0.7 expelled from cluster gpfs0", "infra/filesystem/gpfs"),
    ("sd 2:0:0:0: [sdc] Sense Key : Medium Error", "hardware/storage/disk"),
    ("Uhhuh. NMI received for unknown reason 3d", "hardware/cpu/nmi"),
    ("ciod: failed to start job 81: program image missing", "infra/launcher/job-launch"),
    ("pbs_mom: Bad file descriptor (9) in tm_request, job 12 not running", "infra/launcher/job-launch"),
    ("slurmctld: error: Node gpu-7 has low real_memory size", "infra/resource-manager/error"),
    ("node card J09 failed the power-on self test", "infra/node/state-change"),
    ("Power deactivated on rack R33 by the service controller", "hardware/power"),
    ("Temperature over limit on link card L2 (71 C)", "hardware/thermal"),
    ("instruction cache parity error corrected", None),
    ("12 torus receiver input pipe errors detected and corrected", None),
    ("3 double-hummer alignment exceptions", None),
])
def test_hpc_failure_families(message, category):
    assert load_taxonomy().match_rule(message) == category


def test_blue_gene_ras_lines_are_read_without_their_label(tmp_path):
    # The first field of the CFDR/loghub Blue Gene format is the data set's alert label: the answer. The
    # analysis must judge the message alone, so swapped labels change nothing.
    msgs = ["RAS KERNEL INFO 2 ddr errors detected and corrected on rank 5",
            "RAS KERNEL FATAL rts panic! - stopping the node",
            "RAS KERNEL FATAL r00=0x00000001 r01=0x0fffe2b0 r02=0x00000000",
            "RAS APP FATAL ciod: failed to read job control message from node 12"]
    stamps = itertools.count(1117838570)

    def line(label, msg):
        t = next(stamps)
        return f"{label} {t} 2005.06.03 R02-M1-N0-C:J12-U11 2005-06-03-15.42.50.675872 R02-M1-N0-C:J12-U11 {msg}"

    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("\n".join(line(label, m) for label, m in zip(["KERNDTLB", "-", "-", "-"], msgs)) + "\n")
    b.write_text("\n".join(line(label, m) for label, m in zip(["-", "KERNRTSP", "APPSEV", "KERNMC"], msgs)) + "\n")
    ra, rb = (analyze_logs([str(p)], options=AnalysisOptions()) for p in (a, b))
    assert [(e.line, e.category, e.severity) for e in ra.events] == [(e.line, e.category, e.severity) for e in rb.events]
    assert [e.line for e in ra.events] == [2, 4]
    assert {e.node for e in ra.events} == {"R02-M1-N0-C:J12-U11"} and ra.events[0].timestamp == 1117838571.0
    assert ra.events[0].category == "software/kernel/panic" and ra.events[1].category == "infra/launcher/job-launch"


def test_a_small_systems_few_lines_do_not_outvote_a_large_systems_many_in_the_fit():
    # Regression: every system weighed the same in the detector's fit, so a system with a handful of
    # candidate lines gave each of them the weight of dozens of another's (three Android warnings set the
    # warning level's weight that every other fold was judged with). A system weighs sqrt(its lines) now.
    from ucp.tools.bench.logs_loso import fit_detector

    stats = TemplateStats(lines=50, nodes=1, total_lines=2000, total_nodes=4)

    def row(severity, words, label):
        evidence = LineEvidence(severity=severity, failure_words=words, strong=False, benign=False, auth=False,
                                exception=False, dump=False)
        return feature_vector(evidence, stats), label

    large = [row(WARNING, 1, 1)] * 100 + [row(INFO, 1, 0)] * 300 + [row(None, 2, 1)] * 100
    small = [row(WARNING, 1, 0)] * 3
    detector = fit_detector({"large": large, "small": small})
    warning = LineEvidence(severity=WARNING, failure_words=1, strong=False, benign=False, auth=False,
                           exception=False, dump=False)
    assert detector.probability(warning, stats) >= detector.threshold
    assert detector.probability(replace(warning, severity=INFO), stats) < detector.threshold

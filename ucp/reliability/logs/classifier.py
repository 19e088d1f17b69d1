"""The fallback classifier: TF-IDF n-grams + a calibrated linear SVM over the taxonomy's examples.

Rules decide what they match; this model covers templates no rule matches.
It is trained on the taxonomy's labeled examples (``normal`` is a class like
any other, so ordinary traffic has somewhere to go), and it only answers when
its probability clears the taxonomy's ``confidence_threshold``; below that a
template is ``unclassified`` rather than guessed.

Example::

    model = TemplateClassifier.train(load_taxonomy())
    model.classify(mask("systemd[1]: Started Session 12 of user carol."))
    # -> Classification(category='normal', confidence=0.82..., method='model')
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from scipy.sparse import csr_matrix
from sklearn.feature_extraction.text import TfidfVectorizer

from ucp.reliability.logs.masking import mask
from ucp.reliability.logs.records import Classification
from ucp.reliability.logs.errors import TaxonomyError
from ucp.reliability.logs.taxonomy import NORMAL, UNCLASSIFIED, Taxonomy

# The fit's settings: a file of fitted numbers is valid only for the settings it was fitted with
# (:mod:`ucp.reliability.logs.fitted` puts them into its digest).
FEATURE_PARAMS = (
    ("chars", {"analyzer": "char_wb", "ngram_range": (3, 5), "sublinear_tf": True, "lowercase": True,
               "min_df": 1}),
    ("words", {"analyzer": "word", "ngram_range": (1, 2), "sublinear_tf": True,
               "token_pattern": r"[A-Za-z_][A-Za-z_]+", "lowercase": True}),
)
SVM_C = 1.0


class TemplateClassifier:
    """A trained model plus the threshold below which it abstains.

    ``features`` is the fitted TF-IDF union, ``coef``/``intercept`` the linear
    SVM's margins per class (columns in :attr:`classes` order) and ``a``/``b``
    the per-class sigmoids (Platt) that turn margins into probabilities.
    """

    def __init__(self, *, vocabularies, idfs, classes, coef, intercept, a, b, threshold: float, features=None):
        self.threshold = threshold
        self.classes = [str(c) for c in classes]
        # sklearn's predict_proba validates its input per call: ~10 ms. The same arithmetic by
        # hand (linear margins, per-class sigmoids, normalisation) takes ~0.1 ms. The analyzers come from
        # unfitted vectorizers of the same settings: a model read from a file needs no sklearn fit.
        self._features = features  # the fitted FeatureUnion when fitted in this process (tests compare it)
        self.vocabularies = [dict(v) for v in vocabularies]
        self.idfs = [np.asarray(idf, dtype=float) for idf in idfs]
        self._blocks = []  # (analyzer, vocabulary, idf, column offset) per FeatureUnion part
        offset = 0
        for (_, params), vocab, idf in zip(FEATURE_PARAMS, self.vocabularies, self.idfs):
            self._blocks.append((TfidfVectorizer(**params).build_analyzer(), vocab, idf, offset))
            offset += len(vocab)
        self._coef = np.asarray(coef, dtype=float)  # (features, classes)
        self._intercept = np.asarray(intercept, dtype=float)
        self._a = np.asarray(a, dtype=float)
        self._b = np.asarray(b, dtype=float)

    def arrays(self) -> dict:
        """The fitted numbers: ``coef`` (features, classes), ``intercept``, ``a`` and ``b`` (classes)."""
        return {"coef": self._coef, "intercept": self._intercept, "a": self._a, "b": self._b}

    def with_threshold(self, threshold: float) -> "TemplateClassifier":
        """The same model with another abstention threshold."""
        return TemplateClassifier(vocabularies=self.vocabularies, idfs=self.idfs, classes=self.classes,
                                  threshold=threshold, features=self._features, **self.arrays())

    def _margins(self, texts: list[str]) -> np.ndarray:
        # TF-IDF (sublinear tf, l2 per block) of each document, as sklearn computes it, as one sparse
        # matrix per block: one product for all documents instead of one small product per document.
        margins = np.tile(self._intercept, (len(texts), 1))
        for analyzer, vocab, idf, offset in self._blocks:
            data: list[float] = []
            indices: list[int] = []
            indptr = [0]
            for text in texts:
                for gram, count in Counter(analyzer(text)).items():  # counted in C, looked up once each
                    col = vocab.get(gram)
                    if col is not None:
                        indices.append(col)
                        data.append(count)
                indptr.append(len(indices))
            if not indices:
                continue
            cols = np.asarray(indices, dtype=np.int64)
            weights = (1.0 + np.log(np.asarray(data, dtype=float))) * idf[cols]
            rows = np.repeat(np.arange(len(texts)), np.diff(indptr))
            norms = np.sqrt(np.bincount(rows, weights=weights * weights, minlength=len(texts)))
            weights /= norms[rows]
            matrix = csr_matrix((weights, cols, np.asarray(indptr)), shape=(len(texts), len(vocab)))
            margins += matrix @ self._coef[offset:offset + len(vocab)]
        return margins

    def probabilities_many(self, masked: list[str]) -> np.ndarray:
        """Calibrated class probabilities, one row per masked message (columns in :attr:`classes` order).

        >>> model = TemplateClassifier.fit(["disk failed", "disk error", "job started", "job done"],
        ...                                ["fail", "fail", "ok", "ok"], threshold=0.5)
        >>> model.probabilities_many(["disk failed again", "job started"]).shape
        (2, 2)
        """
        if not masked:
            return np.zeros((0, len(self.classes)))
        probs = 1.0 / (1.0 + np.exp(self._a * self._margins(masked) + self._b))
        total = probs.sum(axis=1, keepdims=True)
        uniform = np.full_like(probs, 1.0 / probs.shape[1])
        return np.where(total > 0, probs / np.where(total > 0, total, 1.0), uniform)

    def probabilities(self, masked: str) -> np.ndarray:
        """Calibrated class probabilities (order of :attr:`classes`) for one masked message."""
        return self.probabilities_many([masked])[0]

    @classmethod
    def train(cls, taxonomy: Taxonomy, *, seed: int = 0) -> "TemplateClassifier":
        """Fit on every labeled example of ``taxonomy`` (masked as lines are at run time).

        Categories with fewer than 2 examples (a freshly discovered category with
        one example line, say) are left to their rules and templates.
        """
        texts, labels = category_examples(taxonomy)
        return cls.fit(texts, labels, threshold=taxonomy.confidence_threshold, seed=seed)

    @classmethod
    def train_domains(cls, taxonomy: Taxonomy, *, seed: int = 0) -> "TemplateClassifier":
        """A model of the *domain* (hardware, infra, software, user) of failure lines.

        Trained on the failure categories' examples and descriptions; it names
        the domain of a discovered category (with its probability as confidence).
        """
        texts, labels = domain_examples(taxonomy)
        return cls.fit(texts, labels, threshold=0.0, seed=seed)

    @classmethod
    def fit(cls, texts: list[str], labels: list[str], *, threshold: float, seed: int = 0) -> "TemplateClassifier":
        """Fit the TF-IDF + calibrated linear SVM on raw ``texts`` (masked here) and their ``labels``."""
        # Here, not at the top: a model read from its file (the usual run) needs none of these imports.
        from sklearn.model_selection import StratifiedKFold, cross_val_predict
        from sklearn.pipeline import FeatureUnion
        from sklearn.svm import LinearSVC

        counts = {label: labels.count(label) for label in set(labels)}
        kept = [(mask(t), label) for t, label in zip(texts, labels) if counts[label] >= 2]
        if len({label for _, label in kept}) < 2:
            raise TaxonomyError("the taxonomy needs at least two categories with 2 or more examples each "
                                "to train the classifier; add examples")
        texts = [t for t, _ in kept]
        labels = [label for _, label in kept]
        features = FeatureUnion([(name, TfidfVectorizer(**params)) for name, params in FEATURE_PARAMS])
        x = features.fit_transform(texts)
        y = np.array(labels)
        # A linear SVM trains in ~0.1 s where multinomial logistic regression takes seconds on these
        # sparse features. Its margins become probabilities by Platt's sigmoids fitted on out-of-fold
        # margins (what sklearn's CalibratedClassifierCV(method="sigmoid", ensemble=False) does; its
        # one-sigmoid-at-a-time L-BFGS took 4 of every 5 seconds of an analysis run, all classes'
        # Newton steps at once take milliseconds; a test checks the two agree).
        folds = min(3, min(labels.count(label) for label in set(labels)))
        svc = LinearSVC(C=SVM_C, random_state=seed)
        held_out = cross_val_predict(svc, x, y, cv=StratifiedKFold(folds), method="decision_function")
        svc.fit(x, y)
        coef, intercept = svc.coef_.T, svc.intercept_
        if held_out.ndim == 1:  # two classes: one margin, for the second class; the first gets its negation
            held_out = np.column_stack([-held_out, held_out])
            coef, intercept = np.column_stack([-coef[:, 0], coef[:, 0]]), np.array([-intercept[0], intercept[0]])
        a, b = platt_sigmoids(held_out, y[:, None] == svc.classes_[None, :])
        vectorizers = [vec for _, vec in features.transformer_list]
        return cls(vocabularies=[vec.vocabulary_ for vec in vectorizers], idfs=[vec.idf_ for vec in vectorizers],
                   classes=svc.classes_, coef=coef, intercept=intercept, a=a, b=b, threshold=threshold,
                   features=features)

    def classify(self, masked: str) -> Classification:
        """Category and probability for one masked message (``unclassified`` if unsure)."""
        return self.classify_many([masked])[0]

    def classify_many(self, masked: list[str]) -> list[Classification]:
        """:meth:`classify` for many masked messages at once (one sparse product for all of them)."""
        out = []
        for probs in self.probabilities_many(masked):
            best = int(probs.argmax())
            confidence = float(probs[best])
            if confidence < self.threshold:
                out.append(Classification(UNCLASSIFIED, confidence, "threshold"))
            else:
                out.append(Classification(self.classes[best], confidence, "model"))
        return out


def category_examples(taxonomy: Taxonomy) -> tuple[list[str], list[str]]:
    """The category model's training data: every labeled example and its category path."""
    examples = taxonomy.labeled_examples()
    return [text for text, _ in examples], [label for _, label in examples]


def domain_examples(taxonomy: Taxonomy) -> tuple[list[str], list[str]]:
    """The domain model's training data: failure categories' examples and descriptions, by domain."""
    texts, labels = [], []
    for cat in taxonomy.categories:
        if cat.path == NORMAL:
            continue
        for text in (*cat.examples, cat.description):
            if text:
                texts.append(text)
                labels.append(cat.domain)
    return texts, labels


def platt_sigmoids(margins: np.ndarray, positive: np.ndarray, *, iterations: int = 100) -> tuple:
    """Platt's sigmoid per column: ``a, b`` with P(positive) = 1 / (1 + exp(a * margin + b)).

    ``margins`` and ``positive`` are (samples, classes). Each column's fit is
    Platt's (2000): targets smoothed by the class counts, the cross-entropy
    minimised by Newton steps (backtracking when a step does not lower it),
    all columns at once.

    >>> a, b = platt_sigmoids(np.array([[-2.0], [-1.0], [1.0], [2.0], [0.5]]),
    ...                       np.array([[False], [False], [True], [True], [False]]))
    >>> bool(a[0] < 0)
    True
    """
    f = np.asarray(margins, dtype=float)
    pos = np.asarray(positive, dtype=bool)
    n_pos = pos.sum(axis=0)
    n_neg = len(f) - n_pos
    t = np.where(pos, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))

    def loss(a, b):
        z = a * f + b  # P = sigmoid(-z)
        return (np.logaddexp(0.0, z) - (1.0 - t) * z).sum(axis=0)  # -t*log(P) - (1-t)*log(1-P)

    a = np.zeros(f.shape[1])
    b = np.log((n_neg + 1.0) / (n_pos + 1.0))
    current = loss(a, b)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(np.clip(a * f + b, -500, 500)))  # P(positive)
        r = t - p  # d loss / d z
        ga, gb = (r * f).sum(axis=0), r.sum(axis=0)
        w = p * (1.0 - p) + 1e-12
        haa, hab, hbb = (w * f * f).sum(axis=0) + 1e-12, (w * f).sum(axis=0), w.sum(axis=0) + 1e-12
        det = haa * hbb - hab * hab
        da, db = -(hbb * ga - hab * gb) / det, -(haa * gb - hab * ga) / det
        step = np.ones_like(a)
        for _ in range(30):  # halve each column's step until its loss does not rise
            trial = loss(a + step * da, b + step * db)
            worse = trial > current + 1e-12
            if not worse.any():
                break
            step = np.where(worse, step / 2.0, step)
        step = np.where(worse, 0.0, step)  # a column no step improves is at its minimum
        a, b = a + step * da, b + step * db
        current = loss(a, b)
        if max(np.abs(ga).max(), np.abs(gb).max()) < 1e-10:
            break
    return a, b


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

import numpy as np
from sklearn.calibration import CalibratedClassifierCV
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.pipeline import FeatureUnion, make_pipeline
from sklearn.svm import LinearSVC

from reliability.logs.masking import mask
from reliability.logs.records import Classification
from reliability.logs.errors import TaxonomyError
from reliability.logs.taxonomy import NORMAL, UNCLASSIFIED, Taxonomy


class TemplateClassifier:
    """A trained model plus the threshold below which it abstains."""

    def __init__(self, pipeline, threshold: float):
        self._pipeline = pipeline
        self.threshold = threshold
        self.classes = [str(c) for c in pipeline.classes_]
        # sklearn's predict_proba validates its input per calibrator: ~10 ms a call.
        # The same arithmetic by hand (linear margins, per-class sigmoids,
        # normalisation) takes ~0.1 ms; tests check the two agree.
        features, calibrated = pipeline.steps[0][1], pipeline.steps[-1][1].calibrated_classifiers_[0]
        self._features = features
        self._blocks = []  # (vectorizer, vocabulary, idf, column offset) per FeatureUnion part
        offset = 0
        for _, vec in features.transformer_list:
            self._blocks.append((vec.build_analyzer(), vec.vocabulary_, vec.idf_, offset))
            offset += len(vec.vocabulary_)
        self._coef = calibrated.estimator.coef_.T.copy()
        self._intercept = calibrated.estimator.intercept_.copy()
        self._a = np.array([c.a_ for c in calibrated.calibrators])
        self._b = np.array([c.b_ for c in calibrated.calibrators])

    def _margins(self, text: str) -> np.ndarray:
        # TF-IDF (sublinear tf, l2 per block) of one document, as sklearn computes it.
        margins = self._intercept.copy()
        for analyzer, vocab, idf, offset in self._blocks:
            counts: dict[int, int] = {}
            for gram in analyzer(text):
                col = vocab.get(gram)
                if col is not None:
                    counts[col] = counts.get(col, 0) + 1
            if not counts:
                continue
            cols = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
            weights = (1.0 + np.log(np.fromiter(counts.values(), dtype=float, count=len(counts)))) * idf[cols]
            weights /= np.sqrt((weights * weights).sum())
            margins += weights @ self._coef[cols + offset]
        return margins

    def probabilities(self, masked: str) -> np.ndarray:
        """Calibrated class probabilities (order of :attr:`classes`) for one masked message."""
        margins = self._margins(masked)
        probs = 1.0 / (1.0 + np.exp(self._a * margins + self._b))
        total = probs.sum()
        return probs / total if total > 0 else np.full(len(probs), 1.0 / len(probs))

    @classmethod
    def train(cls, taxonomy: Taxonomy, *, seed: int = 0) -> "TemplateClassifier":
        """Fit on every labeled example of ``taxonomy`` (masked as lines are at run time).

        Categories with fewer than 2 examples (a freshly discovered category with
        one example line, say) are left to their rules and templates.
        """
        examples = taxonomy.labeled_examples()
        return cls.fit([text for text, _ in examples], [label for _, label in examples],
                       threshold=taxonomy.confidence_threshold, seed=seed)

    @classmethod
    def train_domains(cls, taxonomy: Taxonomy, *, seed: int = 0) -> "TemplateClassifier":
        """A model of the *domain* (hardware, infra, software, user) of failure lines.

        Trained on the failure categories' examples and descriptions; it names
        the domain of a discovered category (with its probability as confidence).
        """
        texts, labels = [], []
        for cat in taxonomy.categories:
            if cat.path == NORMAL:
                continue
            for text in (*cat.examples, cat.description):
                if text:
                    texts.append(text)
                    labels.append(cat.domain)
        return cls.fit(texts, labels, threshold=0.0, seed=seed)

    @classmethod
    def fit(cls, texts: list[str], labels: list[str], *, threshold: float, seed: int = 0) -> "TemplateClassifier":
        """Fit the TF-IDF + calibrated linear SVM on raw ``texts`` (masked here) and their ``labels``."""
        counts = {label: labels.count(label) for label in set(labels)}
        kept = [(mask(t), label) for t, label in zip(texts, labels) if counts[label] >= 2]
        if len({label for _, label in kept}) < 2:
            raise TaxonomyError("the taxonomy needs at least two categories with 2 or more examples each "
                                "to train the classifier; add examples")
        texts = [t for t, _ in kept]
        labels = [label for _, label in kept]
        features = FeatureUnion([
            ("chars", TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), sublinear_tf=True,
                                      lowercase=True, min_df=1)),
            ("words", TfidfVectorizer(analyzer="word", ngram_range=(1, 2), sublinear_tf=True,
                                      token_pattern=r"[A-Za-z_][A-Za-z_]+", lowercase=True)),
        ])
        # A linear SVM trains in ~0.1 s where multinomial logistic regression
        # takes seconds on these sparse features; sigmoid calibration over
        # cross-validation folds turns its margins into probabilities that the
        # threshold can be applied to.
        folds = min(3, min(labels.count(label) for label in set(labels)))
        model = CalibratedClassifierCV(LinearSVC(C=1.0, random_state=seed), cv=folds, method="sigmoid",
                                       ensemble=False)
        pipeline = make_pipeline(features, model)
        pipeline.fit(texts, labels)
        return cls(pipeline, threshold)

    def classify(self, masked: str) -> Classification:
        """Category and probability for one masked message (``unclassified`` if unsure)."""
        probs = self.probabilities(masked)
        best = int(probs.argmax())
        confidence = float(probs[best])
        if confidence < self.threshold:
            return Classification(UNCLASSIFIED, confidence, "threshold")
        return Classification(self.classes[best], confidence, "model")

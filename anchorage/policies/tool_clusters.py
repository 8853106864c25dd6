"""Argument clusters for tool calls (CacheWise section 5.2, "Predictor Training").

Specification
-------------
A tool call's duration depends on its arguments (``pytest`` on one file vs the suite), so
gap histograms are refined by a cluster of the arguments within each tool.

- Text of a call: ``tool_args`` as a string (dicts: ``key=value`` pairs sorted by key,
  lists joined by spaces), lower-cased.
- Offline warm start (``fit``): per tool, TF-IDF vectors of the texts (scikit-learn
  ``TfidfVectorizer``, word tokens) clustered by k-means (``KMeans``, ``k = min(k_max,
  distinct texts)``, default ``k_max = 4``, ``random_state = seed``). A call is assigned to
  the nearest centroid by cosine distance.
- Online fallback (a tool never fitted): the cluster is the *signature* of the text, its
  first ``signature_words`` (default 2) word tokens (e.g. ``bash`` + ``pytest``), which is
  the argument class in most tool traces.
- Results are memoised per (tool, text) in an LRU-capped table (``max_cache``, 4096), so
  the per-request cost is one dict lookup after the first call; scikit-learn is imported
  only by ``fit``.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any, Hashable, Iterable

_WORD = re.compile(r"[a-z0-9_./-]+")


def args_text(args: Any) -> str:
    if args is None:
        return ""
    if isinstance(args, dict):
        return " ".join(f"{k}={args_text(v)}" for k, v in sorted(args.items(), key=lambda kv: str(kv[0])))
    if isinstance(args, (list, tuple)):
        return " ".join(args_text(a) for a in args)
    return str(args).lower()


class ArgClusterer:
    def __init__(self, k_max: int = 4, signature_words: int = 2, max_cache: int = 4096,
                 seed: int = 0):
        self.k_max = k_max
        self.signature_words = signature_words
        self.max_cache = max_cache
        self.seed = seed
        self._models: dict[Hashable, tuple[Any, Any]] = {}  # tool -> (vectorizer, centroids)
        self._memo: OrderedDict[tuple, Hashable] = OrderedDict()

    def fit(self, calls: Iterable[tuple[Hashable, Any]]) -> "ArgClusterer":
        """Warm start from (tool_name, tool_args) pairs, e.g. a past trace."""
        from sklearn.cluster import KMeans
        from sklearn.feature_extraction.text import TfidfVectorizer

        by_tool: dict[Hashable, list[str]] = {}
        for tool, args in calls:
            if tool is not None:
                by_tool.setdefault(tool, []).append(args_text(args))
        for tool, texts in by_tool.items():
            distinct = sorted(set(texts))
            k = min(self.k_max, len(distinct))
            if k < 2 or not any(_WORD.search(t) for t in distinct):
                continue
            vec = TfidfVectorizer(token_pattern=_WORD.pattern)
            X = vec.fit_transform(texts)
            km = KMeans(n_clusters=k, n_init=4, random_state=self.seed).fit(X)
            self._models[tool] = (vec, km.cluster_centers_)
        self._memo.clear()
        return self

    def signature(self, args: Any) -> str:
        return " ".join(_WORD.findall(args_text(args))[: self.signature_words])

    def cluster(self, tool: Hashable, args: Any) -> Hashable:
        text = args_text(args)
        key = (tool, text)
        memo = self._memo
        c = memo.get(key)
        if c is not None:
            memo.move_to_end(key)
            return c
        model = self._models.get(tool)
        if model is None:
            c = " ".join(_WORD.findall(text)[: self.signature_words])
        else:
            vec, centers = model
            x = vec.transform([text]).toarray()[0]
            best, best_s = 0, -2.0
            for i, ctr in enumerate(centers):
                n = float((ctr * ctr).sum()) ** 0.5 or 1.0
                sc = float((x * ctr).sum()) / n
                if sc > best_s:
                    best, best_s = i, sc
            c = f"k{best}"
        memo[key] = c
        if len(memo) > self.max_cache:
            memo.popitem(last=False)
        return c

    @property
    def fitted_tools(self) -> list[Hashable]:
        return list(self._models)

"""Tokenization for mixed Chinese/English search without a word segmenter.

Latin text becomes lowercase words; Chinese runs become character unigrams plus bigrams
(bigrams carry most of the meaning of two-character words such as 缓存 or 内存). Common
question words and function words are cut out first, so "什么是缓存" does not produce the
noisy bigram 是缓.
"""
from __future__ import annotations

import re

_EN_STOP = frozenset("""a an the is are was were be been being am do does did doing of to in on at by for
with about from into as and or not no but if then than so such this that these those it its what which
who whom whose how why when where can could should would will shall may might must i me my we our you
your he she they them their there here please tell explain describe give show let lets let's us any
some more most very just also too up down out over under again further once only own same both each
few other nor s t don does doesn isn aren use using used work works mean means meaning difference
differences between vs versus benefit benefits advantage advantages note notes search look find retrieve
knowledge base concept definition local my""".split())

# Longest first, so 为什么 is removed before 什么.
_ZH_STOP = sorted("""为什么 什么是 是什么 什么 怎么样 怎么 如何 哪些 哪个 为何 请问 请你 请 帮我 帮忙 解释一下 解释 介绍一下
介绍 说明 一下 简单 简要 讲讲 讲一讲 告诉我 告诉 我们 你们 他们 我的 你的 我 你 他 她 它 这个 那个 这 那 的 了
吗 呢 吧 啊 是 和 与 及 或 在 有 中 对 也 都 就 把 被 给 从 到 用 里 上 下 一个 一种 作用 意思 含义 原理 主要
可以 能 会 要 之 其 区别 不同 好处 优点 缺点 优势 特点 概念 定义 搜索 查找 检索 笔记 资料 知识库 关于 相关
查一下 查查 本地""".split(), key=len, reverse=True)
_ZH_STOP_RE = re.compile("|".join(map(re.escape, _ZH_STOP)))
_TOKEN_RE = re.compile(r"[a-z0-9]+|[\u3400-\u4dbf\u4e00-\u9fff]+")


def is_cjk(text: str) -> bool:
    return any("\u3400" <= ch <= "\u9fff" for ch in text)


def tokenize(text: str) -> list[str]:
    """Lowercase Latin words (stopwords dropped) + CJK unigrams and bigrams."""
    tokens: list[str] = []
    for piece in _TOKEN_RE.findall(_ZH_STOP_RE.sub(" ", text.lower())):
        if not is_cjk(piece):
            if piece not in _EN_STOP:
                tokens.append(stem(piece))
            continue
        tokens.extend(piece)
        tokens.extend(piece[i:i + 2] for i in range(len(piece) - 1))
    return tokens


_SUFFIXES = ("ies", "ing", "ed", "es", "s")


def stem(word: str) -> str:
    """A tiny suffix stripper so caches/cache, positions/positional/position meet."""
    if len(word) <= 3 or word.isdigit():
        return word
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            word = word[: -len(suffix)] + ("y" if suffix == "ies" else "")
            break
    return word[:-1] if word.endswith("e") and len(word) > 4 else word

"""A small job module for tests: transforms importable by name."""

from __future__ import annotations


def identity(df):
    return df


def count(df):
    return df.groupBy("word").count()

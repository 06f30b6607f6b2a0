"""Tests of the strategies (gradient compression)."""

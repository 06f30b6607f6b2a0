"""A worker's process under the strategies: process group (``dist``), device, precision,
model wrappers and seeding. Nothing is imported here: each module is imported where it is used.
"""

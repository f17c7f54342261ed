"""Sharding as data: logical axis names, rules mapping them to mesh axes, and the mesh."""

"""Launchers: XManager (xm_launch.py), GKE JobSet manifests (gke/), Dockerfiles."""

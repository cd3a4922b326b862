"""Peers that `make bench` runs beside tidegate's Kafka path: what a user would otherwise write."""

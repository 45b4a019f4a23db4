"""One live incident, end to end: raise or join it, take part, relay, gather, conclude, leave its files on every node."""

"""fr-otel's Grafana dashboards as code, written with Grafana Labs' grafana-foundation-sdk.

``kit`` is the house style (every panel goes through one of its helpers, which apply the
conventions), ``links`` the data links to traces and drill-downs, ``board`` the dashboard frame
(variables, annotations, layout); ``overview``, ``rank`` and ``infra`` are the three dashboards.
``dashboards/build.py`` writes them as the JSON files Grafana provisions.
"""

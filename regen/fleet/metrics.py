"""Each server's own figures, read from its Prometheus `/metrics` (SGLang 0.5.23 names).

The dispatcher knows what it sent; only the server knows its queue, its KV-cache use and its
speculative accept length. Scraping is plain HTTP with a short deadline, and a server that
does not answer is reported as missing (None), never as zero: a zero would read as an idle
GPU on a three-day run.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from statistics import fmean

from prometheus_client.parser import text_string_to_metric_families

from regen.sglang_api.endpoint import Endpoint

# sample name -> how samples of several ranks (dp > 1) combine into one server figure
_SERIES: dict[str, Callable[[list[float]], float]] = {
    "sglang:num_running_reqs": sum,
    "sglang:num_queue_reqs": sum,
    "sglang:gen_throughput": sum,
    "sglang:token_usage": max,
    "sglang:spec_accept_length": fmean,
    "sglang:generation_tokens_total": sum,
    "sglang:num_retracted_requests_total": sum,
    # Tokens decoded, counted at every decode step (only its mode="decode" samples): the rate
    # of the running batch as it runs, where generation_tokens_total counts at each request's
    # end (the concurrency tuner's measure).
    "sglang:realtime_tokens_total": sum,
}
_MODE = {"sglang:realtime_tokens_total": "decode"}


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """One scrape of one server; a series the server does not export is None."""

    running: float | None
    queued: float | None
    gen_throughput: float | None
    token_usage: float | None
    accept_length: float | None
    generation_tokens: float | None
    decode_tokens: float | None = None
    retracted: float | None = None


def parse_metrics(text: str) -> ServerMetrics | None:
    """The `sglang:` figures of an exposition text; None when it has none of them."""
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            mode = _MODE.get(sample.name)
            if sample.name in _SERIES and (mode is None or sample.labels.get("mode") == mode):
                found.setdefault(sample.name, []).append(float(sample.value))
    if not found:
        return None
    value = {
        name: combine(found[name]) if name in found else None for name, combine in _SERIES.items()
    }
    accept = value["sglang:spec_accept_length"]
    return ServerMetrics(
        running=value["sglang:num_running_reqs"],
        queued=value["sglang:num_queue_reqs"],
        gen_throughput=value["sglang:gen_throughput"],
        token_usage=value["sglang:token_usage"],
        # 0.5.23 exports 0.0 with speculative decoding off; an accept length is at least 1.
        accept_length=accept if accept else None,
        generation_tokens=value["sglang:generation_tokens_total"],
        decode_tokens=value["sglang:realtime_tokens_total"],
        retracted=value["sglang:num_retracted_requests_total"],
    )


def scrape(url: str, timeout_s: float = 5.0) -> ServerMetrics | None:
    """GET `<url>/metrics` (open without the API key, as on SGLang); None if it fails."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=timeout_s) as resp:
            text = resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    try:
        return parse_metrics(text)
    except ValueError:  # not Prometheus text: a proxy's error page, say
        return None


@dataclass(frozen=True, slots=True)
class ServerFigures:
    """One server as the live report shows it; `metrics` None means it could not be read."""

    name: str
    url: str
    metrics: ServerMetrics | None
    tokens_per_s: float | None


class FleetScraper:
    """Scrapes every server in turn; tokens/s from the generation counter between two scrapes.

    The counter's rate is the true delivered speed over the interval, 0 when the server was
    idle. Where there is no earlier scrape (a restart reset the counter, or the server has no
    counter) the server's own `gen_throughput` gauge stands in, but only while it is running
    requests: the gauge keeps its last value when a server goes idle (250 tok/s on a server
    doing nothing). `prime()` takes the first counts, so the first report has a true rate.
    """

    def __init__(self, endpoints: list[Endpoint], timeout_s: float = 5.0) -> None:
        self._endpoints = endpoints
        self._timeout_s = timeout_s
        self._last: dict[str, tuple[float, float]] = {}

    def scrape(self) -> list[ServerFigures]:
        figures = []
        for endpoint in self._endpoints:
            metrics = scrape(endpoint.url, self._timeout_s)
            figures.append(
                ServerFigures(endpoint.name, endpoint.url, metrics, self._rate(endpoint, metrics))
            )
        return figures

    def prime(self) -> None:
        """Take every server's counts, the start of the first interval."""
        self.scrape()

    def _rate(self, endpoint: Endpoint, metrics: ServerMetrics | None) -> float | None:
        if metrics is None:
            return None
        now, tokens = time.monotonic(), metrics.generation_tokens
        previous = self._last.get(endpoint.url)
        if tokens is not None:
            self._last[endpoint.url] = (now, tokens)
        if previous is not None and tokens is not None and tokens >= previous[1]:
            return (tokens - previous[1]) / (now - previous[0]) if now > previous[0] else None
        if not metrics.running:
            return 0.0
        return metrics.gen_throughput

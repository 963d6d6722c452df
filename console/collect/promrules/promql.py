"""What a rule of `engineroom rules` is, and the PromQL pieces every rule is written with:
thresholds and label matchers as PromQL reads them, and how a model's deployments are read
(the gateway's figure where it measured one, else its engine's). The alerts' rules
(console/collect/promrules/alerts.py) and the diagnoses' (console/collect/promrules/diagnoses.py)
share
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from console.collect.prometheus.promql import matcher
from console.core.alertrules import AlertDef, Severity
from console.core.config.load import Model


@dataclass(slots=True)
class Rule:
    """One alerting rule: the alert it raises (name, severity, description, holds), its
    expression, and the labels and annotations it adds."""

    defn: AlertDef
    expr: str
    summary: str  # a template: {{ $labels.x }}, {{ $value }}
    labels: dict[str, str] = field(default_factory=dict)
    severity: Severity | None = None  # the band's, where a breach scales (else the alert's)
    annotations: dict[str, str] = field(default_factory=dict)  # beyond summary, description


def num(value: float) -> str:
    """A threshold as PromQL reads it: 90, 0.95, 0.5."""
    return f"{value:g}"


def one_of(label: str, values: list[str]) -> str:
    """`label=~"..."` selecting exactly these values (sorted: a stable file)."""
    return matcher(label, sorted(set(values)))


def none_of(label: str, values: list[str]) -> str:
    return label + "!~" + one_of(label, values).removeprefix(label + "=~")


def served_names(model: Model) -> list[str]:
    """The names the engines serve a fleet model under (its name, each engine_model)."""
    return [model.name, *(d.engine_model for d in model.deployments if d.engine_model)]


@dataclass(frozen=True, slots=True)
class Judged:
    """How one model's deployments are read: the gateway's figure by model and
    deployment, else the agent's by the deployment it reports serving (so a Triton
    `ensemble` of another model, or another deployment, is never this model's)."""

    model: Model
    window: str

    @property
    def deployments(self) -> str:
        """The agent's series of this model's deployments, joined on (node, engine)."""
        ids = one_of("deployment", [d.id for d in self.model.deployments])
        return (
            f" * on(node, engine) group_left(deployment) "
            f"group by (node, engine, deployment) (engineroom_deployment_state{{{ids}}})"
        )

    def gateway(self, series: str, band: str = "") -> str:
        model = matcher("model", [self.model.name])
        return (
            f"histogram_quantile(0.95, sum by (le, model, deployment) "
            f"(rate(engineroom_gateway_{series}_seconds_bucket{{{model}}}[{self.window}])))" + band
        )

    def gateway_errors(self, band: str = "") -> str:
        model = matcher("model", [self.model.name])
        rate = "sum by (model, deployment) (rate(engineroom_gateway_{}_total{{{}}}[{}]))"
        return (
            f"{rate.format('failures', model, self.window)} / "
            f"{rate.format('requests', model, self.window)}{band}"
        )

    def errors(self, band: str) -> str:
        """The deployments' failed / finished with `band`: the gateway's where it counted
        requests for a deployment, else its engine's, each saying where it was measured."""
        names = one_of("model", served_names(self.model))
        engine = f"engineroom_model_error_ratio{{{names}}}{self.deployments}"
        return self.either(self.gateway_errors(band), engine + band, self.gateway_errors())

    def either(self, gateway: str, engine: str, known: str) -> str:
        """The gateway's figure where it has one (`known`: its figure, not NaN), else the
        engine's; each says where it was measured."""
        return (
            f'label_replace({gateway}, "measured_at", "gateway", "", "") or '
            f'(label_replace({engine}, "measured_at", "engine", "", "") '
            f"unless on(deployment) ({known} >= 0))"
        )

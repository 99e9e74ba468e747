"""How one ``requests`` or ``limits`` map of a container reads in canonical units.

The one rule the rewrite (:mod:`canonical`), the validation (:mod:`validation`) and so the quota
count share. A container may name its cards in more than one spelling (``nvidia.com/gpu: 1`` and
``gpu-core: 100``); each spelling is read on its own through the conversion table, and:

- a zero asks for nothing: it is no spelling at all (the scheduler drops zeros before it looks);
- spellings that say the same amount are one request, written once in canonical names;
- spellings that disagree are no request anyone can read: the rewrite leaves them, validation
  refuses them, naming both (summing them would hand the pod more than either reading);
- two vendors' names are different hardware, never one pool of cards;
- a reading past :data:`MAX_GPU_AMOUNT` is refused, not written: the scheduler could not count it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from .conversion import ConversionConfig, ConversionRule
from .quantity import Quantity
from .resources import DEPRECATED_RENAMES, PERCENT_PER_CARD, VENDOR_WHOLE_GPU_NAMES

# The scheduler holds requests as int64 and scales them (x100 per card, x1000 for milli-units):
# anything beyond this overflows there, so no value above it can mean what the user wrote. The
# rewrite never writes past it either: the API server would refuse the result ("must be an
# integer") on a name the user never wrote.
MAX_GPU_AMOUNT = (2**63 - 1) // (1000 * PERCENT_PER_CARD)


def in_range(amount: int | Fraction) -> bool:
    return amount <= MAX_GPU_AMOUNT


@dataclass(frozen=True, slots=True)
class Spelling:
    """One name of a map as written, and what it reads as in canonical names."""

    name: str
    quantity: Quantity
    reads: Mapping[str, Fraction]

    def describe(self, output: str) -> str:
        written = f"{self.name}: {self.quantity.as_written()}"
        if output == self.name:
            return written
        return f"{written} (read as {output}: {Quantity.of(self.reads[output])})"


@dataclass(frozen=True, slots=True)
class Disagreement:
    """Two spellings of one map that ask for different amounts of the same canonical name."""

    output: str
    first: Spelling
    second: Spelling

    def describe(self) -> str:
        return f"{self.first.describe(self.output)} and {self.second.describe(self.output)} disagree"


@dataclass(slots=True)
class ListReading:
    """What a map's convertible names read as; ``agreed`` only when nothing disagrees."""

    inputs: list[Spelling] = field(default_factory=list)  # names the table converts, nonzero
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, why it is not read)
    out_of_range: list[tuple[Spelling, str]] = field(default_factory=list)  # (spelling, output past the bound)
    vendors: list[str] = field(default_factory=list)  # vendor names asked for, sorted
    disagreements: list[Disagreement] = field(default_factory=list)
    agreed: dict[str, int] = field(default_factory=dict)  # canonical name -> amount, when all agree


def renamed(values: Mapping[str, Quantity]) -> dict[str, Quantity]:
    """Deprecated names under their new names, where the new name is absent (as Koordinator does)."""
    result = dict(values)
    for old, new in DEPRECATED_RENAMES.items():
        if old in result and new not in result:
            result[new] = result.pop(old)
    return result


def read_list(values: Mapping[str, Quantity], config: ConversionConfig,
              blocked: frozenset[str] | set[str] = frozenset()) -> ListReading:
    """Read a parsed map (deprecated names already renamed); ``blocked`` names are not read."""
    reading = ListReading()
    for name in sorted((set(values) & config.input_names) - set(blocked)):
        rule = config.rule_for(name)
        assert rule is not None
        quantity = values[name]
        if quantity.is_zero():
            continue  # asks for nothing; left as written (harmless: the scheduler drops zeros)
        if quantity.amount < 0:
            reading.skipped.append((name, f"negative value {quantity.as_written()} left for validation to refuse"))
            continue
        if rule.whole_units_only and not quantity.is_integer():
            reading.skipped.append((name, f"{quantity.as_written()} is not a whole number of cards; left as is"))
            continue
        spelling = Spelling(name, quantity, _reads(quantity, rule))
        past = sorted(output for output, amount in spelling.reads.items() if not in_range(amount))
        if past:
            reading.out_of_range.append((spelling, past[0]))
            reading.skipped.append((name, f"{quantity.as_written()} reads as {past[0]}: "
                                          f"{Quantity.of(spelling.reads[past[0]])}, larger than {MAX_GPU_AMOUNT}; "
                                          "left as is"))
            continue
        reading.inputs.append(spelling)
    reading.vendors = sorted(s.name for s in reading.inputs if s.name in VENDOR_WHOLE_GPU_NAMES)
    if not reading.inputs or len(reading.vendors) > 1:
        return reading  # two vendors are refused as such, not as amounts that disagree
    # Every spelling of each canonical name: the inputs' readings, then what is written under the
    # name itself (a hand-written zero asks for nothing, so it is no spelling).
    by_output: dict[str, list[Spelling]] = {}
    for spelling in reading.inputs:
        for output in spelling.reads:
            by_output.setdefault(output, []).append(spelling)
    for output in sorted(by_output):
        if output in values and not values[output].is_zero():
            by_output[output].append(Spelling(output, values[output], {output: values[output].amount}))
        spellings = by_output[output]
        first = spellings[0]
        other = next((s for s in spellings[1:] if s.reads[output] != first.reads[output]), None)
        if other is not None:
            reading.disagreements.append(Disagreement(output, first, other))
        else:
            reading.agreed[output] = math.ceil(first.reads[output])
    if reading.disagreements:
        reading.agreed = {}
    return reading


def _reads(quantity: Quantity, rule: ConversionRule) -> dict[str, Fraction]:
    # Round up: a conversion must never hand a pod less than it asked for.
    return {output: Fraction(math.ceil(quantity.amount * per_unit))
            for output, per_unit in sorted(rule.outputs.items())}

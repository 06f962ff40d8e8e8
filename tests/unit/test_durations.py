from datetime import timedelta

import pytest

from reaper.durations import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("3h", 10800),
        ("2d", 172800),
        ("1.5h", 5400),
        ("0s", 0),
        ("P3D", 259200),
        ("PT72H", 259200),
        ("P1DT2H30M", 95400),
        ("PT90S", 90),
        ("pt15m", 900),
        ("P1W", 604800),
    ],
)
def test_accepted_forms(text: str, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "text", ["-3h", "3", "3 hours", "P", "PT", "P1M", "P1Y", "", "h3", "-PT1H", "\u0663h", "P\u0663D"]
)
def test_rejected_forms_name_the_expected_format(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected a (non-negative )?duration"):
        parse_duration(text)


@pytest.mark.parametrize("value", [3600, 1.5, None, True])
def test_bare_numbers_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(value)


@pytest.mark.parametrize(
    "value", ["99999999999d", "P99999999999D", "1" + "0" * 400 + "s", "24856d", "PT9999999999H", timedelta(days=30000)]
)
def test_durations_beyond_the_cap_name_it(value: object) -> None:
    # Past the cap, sums like max_job_timeout + slack overflow and MongoDB refuses the TTL.
    with pytest.raises(ValueError, match=r"expected a duration of at most 24855d \(about 68 years\)"):
        parse_duration(value)


def test_the_cap_itself_is_accepted() -> None:
    assert parse_duration("24855d") == timedelta(days=24855)

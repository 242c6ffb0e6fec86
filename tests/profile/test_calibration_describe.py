"""What `gearshift simulate` prints of a calibration: every line a whole sentence, the links' line saying what
prices a message when --links measured none."""

from gearshift.profile.calibration import Calibration
from gearshift.profile.fit import LineFit


def _links_line(cal: Calibration) -> str:
    return next(ln for ln in cal.describe().splitlines() if "message latency" in ln)


def test_unmeasured_links_say_what_prices_a_message():
    line = _links_line(Calibration([LineFit(1.0, 0.001)]))
    assert "--links measures it" in line
    assert line.rstrip().endswith("priced by the cluster state's links"), line


def test_measured_links_print_their_latency_and_rate():
    cal = Calibration([LineFit(1.0, 0.001)] * 2, latency_s=[50e-6], bandwidth_Bps=[1.25e9])
    assert _links_line(cal).strip() == "message latency 50 us one way, 10 Gbit/s"

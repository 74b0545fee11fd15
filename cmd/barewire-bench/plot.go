package main

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"slices"
	"strings"
)

// writePlot draws latency percentiles (log scale) against offered rate for
// each pipeline of the sweep and writes a PNG. It uses only the standard
// library: lines, markers and a small bitmap font drawn pixel by pixel.
func writePlot(path string, pts []sweepPoint) error {
	const W, H = 1100, 640
	const left, right, top, bottom = 90, 260, 60, 80
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	fill(img, img.Bounds(), color.RGBA{255, 255, 255, 255})

	var xmax, ymin, ymax float64 = 0, math.Inf(1), 0
	for _, p := range pts {
		xmax = max(xmax, p.rate)
		for _, v := range []float64{p.p50, p.p95, p.p99} {
			if v > 0 && !math.IsNaN(v) {
				ymin, ymax = min(ymin, v), max(ymax, v)
			}
		}
	}
	if xmax == 0 || ymax == 0 {
		return fmt.Errorf("no sweep points with latency samples")
	}
	xmax = niceCeil(xmax * 1.05)
	ylo := math.Pow(10, math.Floor(math.Log10(ymin)))
	yhi := math.Pow(10, math.Ceil(math.Log10(ymax)))
	if yhi/ylo < 100 {
		yhi = ylo * 100
	}
	pw, ph := float64(W-left-right), float64(H-top-bottom)
	px := func(x float64) int { return left + int(x/xmax*pw) }
	py := func(y float64) int {
		return top + int((math.Log10(yhi)-math.Log10(y))/(math.Log10(yhi)-math.Log10(ylo))*ph)
	}
	grid := color.RGBA{225, 225, 225, 255}
	axis := color.RGBA{60, 60, 60, 255}
	// Grid: decades (and 2, 5 within them) and x ticks.
	for d := ylo; d <= yhi*1.0001; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			y := d * m
			if y > yhi*1.0001 {
				break
			}
			line(img, left, py(y), W-right, py(y), 1, grid, nil)
			drawText(img, fmtTick(y), left-8-textWidth(fmtTick(y), 2), py(y)-7, 2, axis)
		}
	}
	step := niceStep(xmax / 8)
	for x := 0.0; x <= xmax+1e-9; x += step {
		line(img, px(x), top, px(x), H-bottom, 1, grid, nil)
		s := fmt.Sprintf("%.0f", x)
		drawText(img, s, px(x)-textWidth(s, 2)/2, H-bottom+10, 2, axis)
	}
	// 50 ms reference.
	if 50 > ylo && 50 < yhi {
		line(img, left, py(50), W-right, py(50), 1, color.RGBA{200, 0, 0, 255}, []int{6, 6})
		drawText(img, "50 MS", W-right-70, py(50)-18, 2, color.RGBA{200, 0, 0, 255})
	}
	line(img, left, top, left, H-bottom, 2, axis, nil)
	line(img, left, H-bottom, W-right, H-bottom, 2, axis, nil)
	drawText(img, "LATENCY: PRODUCER COMMIT TO CONSUMER COMMIT, BY OFFERED RATE", left, 8, 2, axis)
	drawText(img, "OFFERED RATE (MSG/S)", left+int(pw)/2-textWidth("OFFERED RATE (MSG/S)", 2)/2, H-bottom+40, 2, axis)
	drawText(img, "MS (LOG)", 8, top-30, 2, axis)

	colors := map[string]color.RGBA{"e2e": {31, 119, 180, 255}, "baseline": {255, 127, 14, 255}}
	names := map[string]string{"e2e": "BAREWIRE E2E", "baseline": "BASELINE"}
	type pct struct {
		name   string
		get    func(sweepPoint) float64
		dash   []int
		width  int
		marker int
	}
	pcts := []pct{
		{"P50", func(p sweepPoint) float64 { return p.p50 }, nil, 3, 0},
		{"P95", func(p sweepPoint) float64 { return p.p95 }, []int{3, 4}, 2, 1},
		{"P99", func(p sweepPoint) float64 { return p.p99 }, []int{10, 6}, 2, 2},
	}
	ly := top + 10
	for _, pipe := range []string{"e2e", "baseline"} {
		var series []sweepPoint
		for _, p := range pts {
			if p.pipeline == pipe && p.n > 0 {
				series = append(series, p)
			}
		}
		if len(series) == 0 {
			continue
		}
		slices.SortFunc(series, func(a, b sweepPoint) int { return int(a.rate - b.rate) })
		c := colors[pipe]
		for _, q := range pcts {
			for i := range series {
				x, y := px(series[i].rate), py(max(q.get(series[i]), ylo))
				if i > 0 {
					x0, y0 := px(series[i-1].rate), py(max(q.get(series[i-1]), ylo))
					line(img, x0, y0, x, y, q.width, c, q.dash)
				}
				mark(img, x, y, q.marker, c)
			}
			// Legend entry.
			lx := W - right + 20
			line(img, lx, ly+7, lx+40, ly+7, q.width, c, q.dash)
			mark(img, lx+20, ly+7, q.marker, c)
			drawText(img, names[pipe]+" "+q.name, lx+50, ly, 2, axis)
			ly += 26
		}
		ly += 10
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func fmtTick(v float64) string {
	if v < 1 {
		return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
	}
	return fmt.Sprintf("%.0f", v)
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func niceCeil(v float64) float64 {
	s := niceStep(v / 8)
	return math.Ceil(v/s) * s
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

func dot(img *image.RGBA, x, y, w int, c color.RGBA) {
	for dy := -(w / 2); dy < w-w/2; dy++ {
		for dx := -(w / 2); dx < w-w/2; dx++ {
			if image.Pt(x+dx, y+dy).In(img.Bounds()) {
				img.SetRGBA(x+dx, y+dy, c)
			}
		}
	}
}

// line draws from (x0,y0) to (x1,y1) with width w; dash is an on/off
// pattern in pixels (nil: solid).
func line(img *image.RGBA, x0, y0, x1, y1, w int, c color.RGBA, dash []int) {
	dx, dy := float64(x1-x0), float64(y1-y0)
	n := int(math.Max(math.Abs(dx), math.Abs(dy)))
	period := 0
	for _, d := range dash {
		period += d
	}
	for i := 0; i <= n; i++ {
		if period > 0 {
			pos := i % period
			on, acc := true, 0
			for k, d := range dash {
				acc += d
				if pos < acc {
					on = k%2 == 0
					break
				}
			}
			if !on {
				continue
			}
		}
		t := 0.0
		if n > 0 {
			t = float64(i) / float64(n)
		}
		dot(img, x0+int(math.Round(t*dx)), y0+int(math.Round(t*dy)), w, c)
	}
}

// mark draws a marker: 0 filled circle, 1 square, 2 triangle.
func mark(img *image.RGBA, x, y, kind int, c color.RGBA) {
	const r = 5
	for dy := -r; dy <= r; dy++ {
		for dx := -r; dx <= r; dx++ {
			in := false
			switch kind {
			case 0:
				in = dx*dx+dy*dy <= r*r
			case 1:
				in = abs(dx) <= r-1 && abs(dy) <= r-1
			case 2:
				in = dy >= -r && dy <= r-1 && abs(dx)*2 <= dy+r
			}
			if in && image.Pt(x+dx, y+dy).In(img.Bounds()) {
				img.SetRGBA(x+dx, y+dy, c)
			}
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func textWidth(s string, scale int) int { return len(s) * 6 * scale }

// drawText renders s (upper-cased) with the 5×7 font at scale.
func drawText(img *image.RGBA, s string, x, y, scale int, c color.RGBA) {
	for _, r := range strings.ToUpper(s) {
		g, ok := glyphs[r]
		if !ok {
			g = glyphs['?']
		}
		for row, bits := range g {
			for col, b := range bits {
				if b != '1' {
					continue
				}
				for sy := 0; sy < scale; sy++ {
					for sx := 0; sx < scale; sx++ {
						px, py := x+col*scale+sx, y+row*scale+sy
						if image.Pt(px, py).In(img.Bounds()) {
							img.SetRGBA(px, py, c)
						}
					}
				}
			}
		}
		x += 6 * scale
	}
}

// glyphs is a 5×7 bitmap font: the characters the plot needs.
var glyphs = map[rune][7]string{
	'0': {"01110", "10001", "10011", "10101", "11001", "10001", "01110"},
	'1': {"00100", "01100", "00100", "00100", "00100", "00100", "01110"},
	'2': {"01110", "10001", "00001", "00010", "00100", "01000", "11111"},
	'3': {"11111", "00010", "00100", "00010", "00001", "10001", "01110"},
	'4': {"00010", "00110", "01010", "10010", "11111", "00010", "00010"},
	'5': {"11111", "10000", "11110", "00001", "00001", "10001", "01110"},
	'6': {"00110", "01000", "10000", "11110", "10001", "10001", "01110"},
	'7': {"11111", "00001", "00010", "00100", "01000", "01000", "01000"},
	'8': {"01110", "10001", "10001", "01110", "10001", "10001", "01110"},
	'9': {"01110", "10001", "10001", "01111", "00001", "00010", "01100"},
	'A': {"01110", "10001", "10001", "11111", "10001", "10001", "10001"},
	'B': {"11110", "10001", "10001", "11110", "10001", "10001", "11110"},
	'C': {"01110", "10001", "10000", "10000", "10000", "10001", "01110"},
	'D': {"11100", "10010", "10001", "10001", "10001", "10010", "11100"},
	'E': {"11111", "10000", "10000", "11110", "10000", "10000", "11111"},
	'F': {"11111", "10000", "10000", "11110", "10000", "10000", "10000"},
	'G': {"01110", "10001", "10000", "10111", "10001", "10001", "01111"},
	'H': {"10001", "10001", "10001", "11111", "10001", "10001", "10001"},
	'I': {"01110", "00100", "00100", "00100", "00100", "00100", "01110"},
	'J': {"00111", "00010", "00010", "00010", "00010", "10010", "01100"},
	'K': {"10001", "10010", "10100", "11000", "10100", "10010", "10001"},
	'L': {"10000", "10000", "10000", "10000", "10000", "10000", "11111"},
	'M': {"10001", "11011", "10101", "10101", "10001", "10001", "10001"},
	'N': {"10001", "10001", "11001", "10101", "10011", "10001", "10001"},
	'O': {"01110", "10001", "10001", "10001", "10001", "10001", "01110"},
	'P': {"11110", "10001", "10001", "11110", "10000", "10000", "10000"},
	'Q': {"01110", "10001", "10001", "10001", "10101", "10010", "01101"},
	'R': {"11110", "10001", "10001", "11110", "10100", "10010", "10001"},
	'S': {"01111", "10000", "10000", "01110", "00001", "00001", "11110"},
	'T': {"11111", "00100", "00100", "00100", "00100", "00100", "00100"},
	'U': {"10001", "10001", "10001", "10001", "10001", "10001", "01110"},
	'V': {"10001", "10001", "10001", "10001", "10001", "01010", "00100"},
	'W': {"10001", "10001", "10001", "10101", "10101", "10101", "01010"},
	'X': {"10001", "10001", "01010", "00100", "01010", "10001", "10001"},
	'Y': {"10001", "10001", "10001", "01010", "00100", "00100", "00100"},
	'Z': {"11111", "00001", "00010", "00100", "01000", "10000", "11111"},
	' ': {"00000", "00000", "00000", "00000", "00000", "00000", "00000"},
	'.': {"00000", "00000", "00000", "00000", "00000", "01100", "01100"},
	',': {"00000", "00000", "00000", "00000", "01100", "00100", "01000"},
	'-': {"00000", "00000", "00000", "11111", "00000", "00000", "00000"},
	'/': {"00000", "00001", "00010", "00100", "01000", "10000", "00000"},
	'(': {"00010", "00100", "01000", "01000", "01000", "00100", "00010"},
	')': {"01000", "00100", "00010", "00010", "00010", "00100", "01000"},
	':': {"00000", "01100", "01100", "00000", "01100", "01100", "00000"},
	'=': {"00000", "00000", "11111", "00000", "11111", "00000", "00000"},
	'%': {"11000", "11001", "00010", "00100", "01000", "10011", "00011"},
	'_': {"00000", "00000", "00000", "00000", "00000", "00000", "11111"},
	'+': {"00000", "00100", "00100", "11111", "00100", "00100", "00000"},
	'?': {"01110", "10001", "00001", "00010", "00100", "00000", "00100"},
}

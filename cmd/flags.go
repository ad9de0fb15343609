package cmd

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/alecthomas/kong"

	"github.com/stepwise-run/stepwise/runner/ops"
)

// The conventions every command's flags follow, applied in one place:
//
//   - an int flag or a duration flag is never negative, and one tagged
//     nonzero:"" is never zero either (`--lease 0s`, `--every 0s`); a value
//     given as "-5" or "-5s" is read as a number and refused in our words,
//     naming the flag and what to give instead, not taken for a short flag.
//     An int64 flag is money (minor units) and may be negative: "-500" is
//     read as its value too, and only nonzero:"" constrains it.
//   - an enum flag's help lists its values.
//   - the program's own flags in a command's help come first, the global
//     ones after them under "Global flags:".
//   - every text flag, argument and parameter value (from the command
//     line or the environment) is valid UTF-8 without control characters
//     (ops.CheckText; newlines and tabs only in --reason and --output), refused
//     naming the flag, exit 2.
func cliConventions() []kong.Option {
	return []kong.Option{
		kong.KindMapper(reflect.String, textMapper{}),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.ValueFormatter(helpValue),
		kong.TypeMapper(reflect.TypeFor[time.Duration](), durationMapper{}),
		kong.KindMapper(reflect.Int, intMapper{}),
		kong.KindMapper(reflect.Int64, intMapper{signed: true}),
		kong.NamedMapper("database", dbMapper{}),
	}
}

// nonzeroTag is the struct tag key that makes an int or duration flag
// refuse zero.
const nonzeroTag = "nonzero"

// durationMapper decodes a time.Duration flag, refusing negative values
// (and zero with nonzero:"").
type durationMapper struct{}

func (durationMapper) Decode(ctx *kong.DecodeContext, target reflect.Value) error {
	s, err := numberToken(ctx, "duration")
	if err != nil {
		return err
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration; use one such as %s", s, durationExample(ctx.Value))
	}
	switch {
	case d < 0:
		return fmt.Errorf("%s is negative; use %s", s, durationWant(ctx.Value))
	case d == 0 && ctx.Value.Tag.Has(nonzeroTag):
		return fmt.Errorf("%s is not allowed; use %s", s, durationWant(ctx.Value))
	}
	target.SetInt(int64(d))
	return nil
}

func durationWant(v *kong.Value) string {
	if v.Tag.Has(nonzeroTag) {
		return "a positive duration such as " + durationExample(v)
	}
	return "0 or a positive duration such as " + durationExample(v)
}

// durationExample is the flag's default if it has a positive one, else 30s.
func durationExample(v *kong.Value) string {
	if d, err := time.ParseDuration(v.Default); err == nil && d > 0 {
		return v.Default
	}
	return "30s"
}

// intMapper decodes an int flag, refusing negative values (and zero with
// nonzero:""), or with signed an int64 flag, refusing only zero with
// nonzero:"".
type intMapper struct{ signed bool }

func (m intMapper) Decode(ctx *kong.DecodeContext, target reflect.Value) error {
	s, err := numberToken(ctx, "int")
	if err != nil {
		return err
	}
	size := bits.UintSize
	if m.signed {
		size = 64
	}
	n, err := strconv.ParseInt(s, 10, size)
	if err != nil {
		return fmt.Errorf("%q is not a whole number; use %s", s, m.want(ctx.Value))
	}
	switch {
	case n < 0 && !m.signed:
		return fmt.Errorf("%d is negative; use %s", n, m.want(ctx.Value))
	case n == 0 && ctx.Value.Tag.Has(nonzeroTag):
		return fmt.Errorf("0 is not allowed; use %s", m.want(ctx.Value))
	}
	target.SetInt(n)
	return nil
}

func (m intMapper) want(v *kong.Value) string {
	switch {
	case m.signed && v.Tag.Has(nonzeroTag):
		return "a whole number other than 0"
	case m.signed:
		return "a whole number"
	case v.Tag.Has(nonzeroTag):
		return "a whole number of at least 1"
	}
	return "0 or a whole number above it"
}

// numberToken pops a flag's value as a string. A value that looks like a
// negative number ("-5", "-5s", "-.5s") is taken as the value, where kong
// would read it as a short flag and say so.
func numberToken(ctx *kong.DecodeContext, what string) (string, error) {
	if t := ctx.Scan.Peek(); t.Type == kong.UntypedToken {
		if s, ok := t.Value.(string); ok && len(s) > 1 && s[0] == '-' && (s[1] == '.' || s[1] >= '0' && s[1] <= '9') {
			ctx.Scan.Pop()
			return s, nil
		}
	}
	t, err := ctx.Scan.PopValue(what)
	if err != nil {
		return "", err
	}
	switch v := t.Value.(type) {
	case string:
		return v, nil
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		if what == "duration" {
			return fmt.Sprint(v) + "ns", nil
		}
		return fmt.Sprint(v), nil
	}
	return "", fmt.Errorf("expected %s but got %v (%T)", what, t.Value, t.Value)
}

// helpValue is a flag's help text with its environment variable (kong's
// default) and, for an enum, its values.
func helpValue(v *kong.Value) string {
	h := kong.DefaultHelpValueFormatter(v)
	if v.Enum == "" {
		return h
	}
	var vals []string
	for _, e := range v.EnumSlice() {
		if e != "" {
			vals = append(vals, e)
		}
	}
	if h != "" && !strings.HasSuffix(h, ".") {
		h += "."
	}
	return strings.TrimSpace(h + " One of: " + strings.Join(vals, ", ") + ".")
}

// globalGroup heads the flags every command takes in its help, after the
// command's own.
var globalGroup = &kong.Group{Key: "global", Title: "Global flags:"}

// groupGlobals puts the program-level flags (but --help) in globalGroup,
// the stock ones and those a program adds (the stock binary's --tz) alike.
func groupGlobals(k *kong.Kong) {
	for _, f := range k.Model.Flags {
		if f.Name != "help" && f.Group == nil {
			f.Group = globalGroup
		}
	}
}

// helpPath is the command whose --help a usage error points to: the
// command being parsed, or the program.
func helpPath(name string, ctx *kong.Context) string {
	if ctx != nil {
		if n := ctx.Selected(); n != nil {
			return n.FullPath()
		}
	}
	return name
}

// textMapper decodes a string flag or argument, refusing what
// ops.CheckText refuses (kong's error names the flag).
type textMapper struct{}

func (textMapper) Decode(ctx *kong.DecodeContext, target reflect.Value) error {
	var s string
	if err := ctx.Scan.PopValueInto("string", &s); err != nil {
		return err
	}
	name := ""
	if ctx.Value != nil {
		name = ctx.Value.Name // "reason" may span lines
	}
	if err := ops.CheckText(name, s); err != nil {
		var te *ops.TextError
		if errors.As(err, &te) {
			te.Field = "the value" // kong's error names the flag
		}
		return err
	}
	target.SetString(s)
	return nil
}

// checkArgs applies ops.CheckText to the raw command line and to the
// environment variables flags read, before kong parses them: kong hands
// a mapper bytes that are not UTF-8 already turned into U+FFFD. A bad
// value is named by its flag (the one it follows, or --flag=value), an
// argument by its position, a variable by its name and flag.
func checkArgs(model *kong.Node, args []string) error {
	for i, a := range args {
		if utf8.ValidString(a) {
			continue
		}
		field := fmt.Sprintf("argument %d", i+1)
		switch name, _, eq := strings.Cut(a, "="); {
		case strings.HasPrefix(a, "-") && eq:
			field = name
		case i > 0 && strings.HasPrefix(args[i-1], "-") && !strings.Contains(args[i-1], "="):
			field = args[i-1]
		}
		return usageError{ops.CheckText(field, a)}
	}
	var err error
	_ = kong.Visit(model, func(n kong.Visitable, next kong.Next) error {
		if f, ok := n.(*kong.Flag); ok && err == nil {
			for _, env := range f.Envs {
				if v, set := os.LookupEnv(env); set {
					if e := ops.CheckText(f.Name, v); e != nil {
						var te *ops.TextError
						if errors.As(e, &te) {
							te.Field = "$" + env + " (--" + f.Name + ")"
						}
						err = usageError{e}
					}
				}
			}
		}
		return next(nil)
	})
	return err
}

package daemon

import "errors"

// UsageError marks bad input: a configuration key, a path, a flag's
// value (exit status 2).
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// ReportedError carries an exit status, as a detached daemon reported
// it; Printed errors are not printed again.
type ReportedError struct {
	Err     error
	Code    int
	Printed bool
}

func (e ReportedError) Error() string { return e.Err.Error() }
func (e ReportedError) Unwrap() error { return e.Err }

// ExitCode is the process's exit status for err: 0 for nil, the status a
// detached daemon reported, 2 for bad input, else 1.
func ExitCode(err error) int {
	var re ReportedError
	var ue UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &re):
		return re.Code
	case errors.As(err, &ue):
		return 2
	}
	return 1
}

package main

import (
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"

	"github.com/gdsfs/gdsfs/internal/config"
)

// newLogger logs to stderr: console text on a terminal (or when asked),
// JSON otherwise.
func newLogger(c config.Log) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return nil, err
	}
	console := c.Format == "console" || (c.Format == "auto" && term.IsTerminal(int(os.Stderr.Fd())))
	var zc zap.Config
	if console {
		zc = zap.NewDevelopmentConfig()
		zc.Development = false
		zc.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
		if !term.IsTerminal(int(os.Stderr.Fd())) {
			zc.EncoderConfig.EncodeLevel = zapcore.CapitalLevelEncoder
		}
	} else {
		zc = zap.NewProductionConfig()
		zc.Sampling = nil
	}
	zc.Level = zap.NewAtomicLevelAt(level)
	zc.DisableStacktrace = true
	zc.OutputPaths = []string{"stderr"}
	return zc.Build()
}

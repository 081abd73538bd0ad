package claims

import "fmt"

// validate checks a command on its own, before it touches a record: a
// command that fails is one the leader never proposes (ErrBadCommand).
func validate(cmd *Command) error {
	switch cmd.Op {
	case OpClaim:
		if cmd.LeaseMs <= 0 || len(cmd.Candidates) == 0 {
			return fmt.Errorf("%w: claim needs a positive lease and candidates", ErrBadCommand)
		}
	case OpRenew:
		if cmd.LeaseMs <= 0 {
			return fmt.Errorf("%w: renew needs a positive lease", ErrBadCommand)
		}
	case OpEnd:
		if len(cmd.Ends) == 0 {
			return fmt.Errorf("%w: end without ends", ErrBadCommand)
		}
		for _, e := range cmd.Ends {
			if !e.Reason.terminal() {
				return fmt.Errorf("%w: end reason %v of task %d is not terminal", ErrBadCommand, e.Reason, e.ID)
			}
		}
	case OpExpire:
		if cmd.SkewMs < 0 {
			return fmt.Errorf("%w: negative skew", ErrBadCommand)
		}
	case OpAct:
		if len(cmd.Acts) == 0 {
			return fmt.Errorf("%w: act without acts", ErrBadCommand)
		}
		for _, act := range cmd.Acts {
			switch {
			case act.Token == 0:
				return fmt.Errorf("%w: act on task %d without a claim", ErrBadCommand, act.ID)
			case act.End != EndNone && act.End != EndCompleted && act.End != EndAborted && act.End != EndYielded && act.End != EndFailed:
				return fmt.Errorf("%w: act end %v of task %d", ErrBadCommand, act.End, act.ID)
			}
		}
	case OpRevive:
		if cmd.Life == 0 {
			return fmt.Errorf("%w: revive of task %d to life 0", ErrBadCommand, cmd.ID)
		}
	case OpDeadline:
		if len(cmd.Deadlines) == 0 {
			return fmt.Errorf("%w: deadline without tasks", ErrBadCommand)
		}
		for _, dl := range cmd.Deadlines {
			if dl.DeadlineMs <= 0 {
				return fmt.Errorf("%w: deadline %d of task %d", ErrBadCommand, dl.DeadlineMs, dl.ID)
			}
		}
	case OpUnique:
		return validateUnique(cmd)
	case OpYield, OpExtend, OpForget:
	default:
		return fmt.Errorf("%w: unknown op %d", ErrBadCommand, cmd.Op)
	}
	return nil
}

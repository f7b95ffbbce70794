"""The room and its sessions: a tab's seat and the person behind it (a cookie), the join door, presenter mode's board and rules."""
